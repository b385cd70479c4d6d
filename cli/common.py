"""Helpers shared by the commands. Nothing here imports MLX or model code."""

from __future__ import annotations

import sys
from dataclasses import dataclass
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
DraftVocabOpt = Annotated[Optional[int], typer.Option(
    "--draft-vocab", min=1, metavar="N", help="Draft from only the N most frequent tokens of "
    "the draft vocabulary: a smaller draft head, cheaper rounds; outputs are the same (`dflash2 "
    "bench` measures the trade).", show_default=False)]
DEFAULT_LOOKUP = 3  # = dflash2_mlx.engine.lookup.DEFAULT_LOOKUP (not imported: no MLX here)
LookupOpt = Annotated[Optional[int], typer.Option(
    "--lookup", min=0, metavar="N", help="Context lookup: when the last N tokens occurred "
    "earlier in the prompt or answer, propose what followed them instead of drafting (free, "
    f"often long and right; outputs are the same). 0: always the drafter. [default: "
    f"{DEFAULT_LOOKUP}]", show_default=False)]


@dataclass(frozen=True)
class DraftOptions:
    """Where drafts come from: the drafter's (limited) draft vocabulary, and context lookup."""

    full_vocab: bool = False
    draft_vocab: int | None = None
    lookup: int = DEFAULT_LOOKUP

    @classmethod
    def from_flags(cls, full_vocab: bool, draft_vocab: int | None, lookup: int | None):
        """From the options as given (`--lookup` absent: the default)."""
        return cls(full_vocab, draft_vocab, DEFAULT_LOOKUP if lookup is None else lookup)


def load_resolved(model, target, drafter, offline: bool, say: Callable[[str], None],
                  draft: DraftOptions = DraftOptions()):
    """Resolve an alias / --target / --drafter, fetch both, load the pair: (pair, resolved)."""
    if draft.full_vocab and draft.draft_vocab is not None:
        fail("--draft-vocab and --full-vocab contradict each other")
    from dflash2_mlx import load_pair
    from dflash2_mlx.registry import fetch, resolve

    resolved = resolve(model, target, drafter)
    tdir = fetch(resolved.target, "target", offline=offline)
    ddir = fetch(resolved.drafter, "drafter", offline=offline)
    alias = f"{resolved.alias}: " if resolved.alias else ""
    say(f"loading {alias}target {resolved.target} + drafter {resolved.drafter}")
    pair = load_pair(tdir, ddir, offline=offline, full_vocab=draft.full_vocab,
                     draft_vocab_limit=draft.draft_vocab, lookup=draft.lookup)
    size = pair.drafter.draft_vocab_size
    if size is not None:
        say(f"draft vocabulary: {size:,} of {pair.drafter.config.vocab_size:,} tokens "
            "(--full-vocab for all)")
    if draft.lookup:
        say(f"context lookup: after a repeat of the last {draft.lookup} tokens (--lookup 0: off)")
    return pair, resolved
