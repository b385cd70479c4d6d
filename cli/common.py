"""Helpers shared by the commands. Nothing here imports MLX or model code."""

from __future__ import annotations

import sys
from typing import Annotated, Callable, Optional

import typer

EXIT_USAGE = 2  # every user mistake: bad option value, unknown model, bad checkpoint ...


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def fail(message: str) -> None:
    raise UserError(message)


def is_user_error(exc: BaseException) -> bool:
    """UserError, or a dflash2_mlx DFlash2Error (checked without importing the library)."""
    if isinstance(exc, UserError):
        return True
    errors = sys.modules.get("dflash2_mlx.errors")
    return errors is not None and isinstance(exc, errors.DFlash2Error)


def print_error(message: str) -> None:
    message = " ".join(str(message).split())  # one line, whatever the exception held
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)


# The model selection shared by chat, serve and bench.
ModelArg = Annotated[Optional[str], typer.Argument(
    help="A model alias (see `dflash2 models`); default: smollm2-135m, the embedded model.",
    show_default=False)]
TargetOpt = Annotated[Optional[str], typer.Option(
    "--target", help="Target model: an mlx-lm folder or a Hugging Face repo id "
    "(replaces the alias's target).")]
DrafterOpt = Annotated[Optional[str], typer.Option(
    "--drafter", help="DFlash / DFlash2 drafter: a folder or a Hugging Face repo id "
    "(replaces the alias's drafter).")]

ThinkingOpt = Annotated[Optional[bool], typer.Option(
    "--thinking/--no-thinking", help="Turn a Qwen-style template's thinking on or off "
    "(default: the template's own).", show_default=False)]
OfflineOpt = Annotated[bool, typer.Option(
    "--offline", help="Never download: use folders and the local Hugging Face cache only.")]
FullVocabOpt = Annotated[bool, typer.Option(
    "--full-vocab", help="Draft from the whole vocabulary, not the drafter's draft vocabulary "
    "(draft_vocab.json: a smaller, cheaper draft head; outputs are the same either way).")]


def load_resolved(model, target, drafter, offline: bool, say: Callable[[str], None],
                  full_vocab: bool = False):
    """Resolve an alias / --target / --drafter, fetch both, load the pair: (pair, resolved)."""
    from dflash2_mlx import load_pair
    from dflash2_mlx.registry import fetch, resolve

    resolved = resolve(model, target, drafter)
    tdir = fetch(resolved.target, "target", offline=offline)
    ddir = fetch(resolved.drafter, "drafter", offline=offline)
    alias = f"{resolved.alias}: " if resolved.alias else ""
    say(f"loading {alias}target {resolved.target} + drafter {resolved.drafter}")
    pair = load_pair(tdir, ddir, offline=offline, full_vocab=full_vocab)
    size = pair.drafter.draft_vocab_size
    if size is not None:
        say(f"draft vocabulary: {size:,} of {pair.drafter.config.vocab_size:,} tokens "
            "(--full-vocab for all)")
    return pair, resolved
