"""`dflash2 chat`'s run: load the pair (the resolver `serve` uses), then one answer
(`--prompt`) or the terminal session (chat_repl.Chat)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.text import Text

from dflash2_mlx import GenerationParams
from dflash2_mlx.errors import ParameterError

from .chat_repl import Chat, ChatOptions
from .common import fail
from .loading import load_engine
from .terminal import ends_on_hangup, keys_unechoed


def run_chat(opts: ChatOptions) -> int:
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per note or error
    try:  # validated before any model loads (the rest is too)
        GenerationParams(opts.max_tokens)
    except ParameterError as exc:
        fail(f"--max-tokens: {exc}")
    pair, resolved, settings = load_engine(  # the same resolver as `dflash2 serve`
        opts.model,
        opts.target,
        opts.drafter,
        opts.offline,
        lambda msg: err.print(Text(msg, style="dim")),
        opts.engine_flags,
    )
    chat = Chat(pair, opts, settings, console, err)
    with ends_on_hangup():
        return (
            _one_answer(chat, opts, settings, err)
            if opts.prompt is not None
            else _session(chat, resolved, settings, err)
        )


def _one_answer(chat: Chat, opts: ChatOptions, settings, err: Console) -> int:
    """--prompt: what it samples with (as the session's banner says), then the answer; keys
    typed meanwhile (Ctrl-C's ^C) are not echoed into it."""
    err.print(Text(f"sampling: {settings.sampling.describe()}", style="dim"))
    with keys_unechoed():
        _, stats, finish = chat.turn(opts.prompt, live=False)
    chat.end_unshown(stats, finish)
    return 130 if finish in ("stopped", "interrupted") else 0


def _session(chat: Chat, resolved, settings, err: Console) -> int:
    spec = settings.block.describe() if chat.spec else "speculative off"
    keys = ", Ctrl-C stops an answer, Ctrl-D exits" if sys.stdin.isatty() else ""
    err.print(
        Text(
            f"{resolved.name}: {spec}, {settings.sampling.describe()}. /help for commands{keys}.",
            style="dim",
        )
    )
    return chat.repl()
