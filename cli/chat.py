"""`dflash2 chat [MODEL]`: options only; the terminal chat itself is in chat_repl (imported
inside the command, so `dflash2 --help` never loads MLX)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import typer

from .common import (
    DraftOptions, DraftVocabOpt, DrafterOpt, FullVocabOpt, LookupOpt, ModelArg,
    OfflineOpt, TargetOpt, ThinkingOpt, fail,
)


@dataclass
class ChatOptions:
    model: Optional[str]
    target: Optional[str]
    drafter: Optional[str]
    prompt: Optional[str]
    system: Optional[str]
    max_tokens: int
    temp: float
    top_p: float
    top_k: int
    min_p: float
    seed: Optional[int]
    block: Optional[int]
    spec: bool
    thinking: Optional[bool]
    offline: bool
    draft: DraftOptions = DraftOptions()


def chat(
    model: ModelArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    prompt: Optional[str] = typer.Option(
        None, "--prompt", "-p", help="Answer this one message, print the answer and a stats "
        "line, and exit."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Most tokens per answer."),
    temp: float = typer.Option(0.0, "--temp", help="Sampling temperature; 0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass, in (0, 1]."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k most likely tokens; 0 = off."),
    min_p: float = typer.Option(0.0, "--min-p", help="Drop tokens below min_p x the top "
                                "probability, in [0, 1)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed for sampling."),
    block: Optional[int] = typer.Option(
        None, "--block", help="Block size: tokens verified per round (default: the alias's "
        "recommendation, else the drafter's trained block size)."),
    no_spec: bool = typer.Option(False, "--no-spec", help="Plain decoding (no drafter), same "
                                 "sampler: for comparison."),
    thinking: ThinkingOpt = None,
    offline: OfflineOpt = False,
    full_vocab: FullVocabOpt = False,
    draft_vocab: DraftVocabOpt = None,
    lookup: LookupOpt = None,
):
    """Chat in the terminal with live acceptance stats (streamed, multi-turn, cached).

    Type /help inside for the commands (/temp, /block, /stats, /spec, ...). Ctrl-C stops an
    answer, Ctrl-D exits.

    Example: dflash2 chat qwen3-4b --temp 0.6 --top-p 0.95

    Example: dflash2 chat --target ./my-model --drafter ./my-drafter --prompt "Hi" --max-tokens 64
    """
    for flag, value in (("--prompt", prompt), ("--system", system)):
        if value is not None and not value.strip():
            fail(f"{flag} is empty")
    if no_spec and block is not None:
        fail("--block has no effect with --no-spec (plain decoding verifies one token a round)")
    if no_spec and lookup is not None:
        fail("--lookup has no effect with --no-spec (plain decoding drafts nothing)")
    opts = ChatOptions(model, target, drafter, prompt, system, max_tokens, temp, top_p, top_k,
                       min_p, seed, block, not no_spec, thinking, offline,
                       DraftOptions.from_flags(full_vocab, draft_vocab, lookup))
    from .chat_repl import run_chat

    return run_chat(opts)


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)
