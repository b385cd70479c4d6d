"""`dflash2 chat [MODEL]`: options only; the terminal chat itself is in chat_repl (imported
inside the command, so `dflash2 --help` never loads MLX)."""

from __future__ import annotations

from typing import Optional

import typer

from .common import (
    BlockOpt,
    ChatTemplateOpt,
    DraftVocabOpt,
    DrafterOpt,
    FullVocabOpt,
    LookupOpt,
    NoDatastoreOpt,
    MinPOpt,
    ModelArg,
    NoSpecOpt,
    OfflineOpt,
    SeedOpt,
    TargetOpt,
    TempOpt,
    ThinkingOpt,
    TopKOpt,
    TopPOpt,
    fail,
    DraftingFlags,
    spec_engine_flags,
    sampling_flags,
)
from .terminal import argument_text, utf8_problem


def chat(
    model: ModelArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    prompt: Optional[str] = typer.Option(
        None,
        "--prompt",
        "-p",
        help="Answer this one message, print the answer and a stats line, and exit.",
    ),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Most tokens per answer."),
    thinking_budget: Optional[int] = typer.Option(
        None,
        "--thinking-budget",
        help="Most tokens a thinking model may think before it answers (its end marker is "
        "then forced; exact).",
        min=0,
    ),
    repetition_penalty: Optional[float] = typer.Option(
        None,
        "--repetition-penalty",
        help="Penalise the last 20 tokens' ids (mlx-lm's: > 1 repeats less; 1: none).",
    ),
    temp: TempOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    seed: SeedOpt = None,
    block: BlockOpt = None,
    no_spec: NoSpecOpt = False,
    thinking: ThinkingOpt = None,
    chat_template: ChatTemplateOpt = None,
    offline: OfflineOpt = False,
    full_vocab: FullVocabOpt = False,
    draft_vocab: DraftVocabOpt = None,
    lookup: LookupOpt = None,
    no_datastore: NoDatastoreOpt = False,
):
    """Chat in the terminal with live acceptance stats (streamed, multi-turn, cached).

    Type /help inside for the commands (/temp, /block, /stats, /spec, ...). Ctrl-C stops an
    answer, Ctrl-D exits.

    Example: dflash2 chat qwen3-4b --temp 0.6 --top-p 0.95

    Example: dflash2 chat --target ./model --drafter ./drafter --prompt "Hi"
    """
    prompt, system = (None if v is None else argument_text(v) for v in (prompt, system))
    for flag, value in (("--prompt", prompt), ("--system", system)):
        if value is not None and not value.strip():
            fail(f"{flag} is empty")
        if value is not None and utf8_problem(value):
            fail(f"{flag} {utf8_problem(value)}")
    one_answer = prompt is not None  # no /spec on or /thinking on to come
    if one_answer and thinking is False and thinking_budget is not None:
        fail("--thinking-budget has no effect with --no-thinking")
    engine = spec_engine_flags(
        no_spec,
        DraftingFlags(block, lookup, no_datastore, full_vocab, draft_vocab),
        sampling_flags(temp, top_p, top_k, min_p, seed),
        chat_template,
        idle="a --prompt answer cannot turn speculation on" if one_answer else None,
    )
    if repetition_penalty is not None:
        from dflash2_mlx.engine.processors import check_penalty
        from dflash2_mlx.errors import ParameterError

        try:
            check_penalty("repetition_penalty", repetition_penalty, vocab=1)
        except ParameterError as e:
            fail(f"--repetition-penalty: {e}")
    from .chat_repl import ChatOptions
    from .chat_run import run_chat

    opts = ChatOptions(
        model,
        target,
        drafter,
        prompt,
        system,
        max_tokens,
        thinking,
        offline,
        engine,
        repetition_penalty,
        thinking_budget,
    )
    return run_chat(opts)


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
