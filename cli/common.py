"""Helpers shared by the commands. Nothing here imports MLX or model code."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash2_mlx.engine.lookup import DEFAULT_LOOKUP  # light: no MLX behind it

EXIT_USAGE = 2  # every user mistake: bad option value, unknown model, bad checkpoint ...


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def fail(message: str) -> None:
    raise UserError(message)


def number_list(text: str, kind: type, flag: str, example: str) -> tuple:
    """'4,8', '4 8' or '4, 8' -> (4, 8) of `kind`, in the order given; a one-line error
    naming `flag` when a part is no number or nothing is given."""
    noun = "integers" if kind is int else "numbers"
    usage = f"{flag} takes comma-separated {noun} (e.g. {flag} {example})"
    parts = str(text).replace(",", " ").split()
    if not parts:
        fail(f"{usage}, got {text!r}")
    out = []
    for part in parts:
        try:
            out.append(kind(part))
        except ValueError:
            fail(f"{usage}: {part!r} in {text!r} is not one")
    return tuple(out)


def output_path(flag: str):
    """A Typer callback for an option that takes a file path: a value that looks like the
    next flag (`--json --no-plot`) is a forgotten path, not a file named '--no-plot'."""

    def check(value):
        if value is not None and str(value).startswith("-"):
            fail(f"{flag} needs a file path, got {str(value)!r} (a flag?)")
        return value

    return check


@dataclass(frozen=True)
class DraftingFlags:
    """A front end's drafting flags as given (None / False: not given)."""

    block: int | None = None
    lookup: int | None = None
    no_datastore: bool = False
    full_vocab: bool = False
    draft_vocab: int | None = None

    def given(self) -> list[str]:
        """The flags given, by name."""
        values = {
            "--block": self.block is not None,
            "--lookup": self.lookup is not None,
            "--no-datastore": self.no_datastore,
            "--full-vocab": self.full_vocab,
            "--draft-vocab": self.draft_vocab is not None,
        }
        return [flag for flag, was_given in values.items() if was_given]


def spec_engine_flags(no_spec: bool, drafting: DraftingFlags, sampling, chat_template, idle=None):
    """engine_flags from a front end's --no-spec, its drafting flags, sampling flags and
    template. `idle`: why nothing could turn speculation on later: with --no-spec, a drafting
    flag given is then refused, naming it (it would be ignored)."""
    for flag in drafting.given() if no_spec and idle else ():
        fail(f"{flag} has no effect with --no-spec: {idle}")
    return engine_flags(
        block=drafting.block,
        spec=not no_spec,
        lookup=drafting.lookup,
        datastore=not drafting.no_datastore,
        full_vocab=drafting.full_vocab,
        draft_vocab=drafting.draft_vocab,
        sampling=sampling,
        chat_template=chat_template,
    )


def check_thinking_flag(tokenizer, thinking: bool | None) -> None:
    """--thinking / --no-thinking needs a template with a thinking switch, or asks what the
    model does anyway (as `serve` decides, and a request's enable_thinking)."""
    from dflash2_mlx.chat_template import TemplateInfo

    if thinking is not None and not TemplateInfo.of(tokenizer).honours_thinking(thinking):
        fail(
            f"--{'' if thinking else 'no-'}thinking: this model's chat template has no "
            f"thinking switch and it {'never' if thinking else 'always'} thinks"
        )


def check_writable(path: Path | None, flag: str, reads: dict[str, str] | None = None) -> None:
    """Fail before the run when the results could not be written at the end, or would replace
    a file the run reads (`reads`: flag -> path)."""
    if path is None:
        return
    for read_flag, spec in (reads or {}).items():
        for read in {str(spec), *str(spec).split("+")}:  # 'a+b.jsonl': each file it joins
            if Path(read).is_file() and Path(read).resolve() == Path(path).resolve():
                fail(f"{flag} {path} is the {read_flag} file this run reads: name another file")
    folder = Path(path).parent
    missing = [up for up in (folder, *folder.parents) if not up.exists()]
    existing = missing[-1].parent if missing else folder
    if not existing.is_dir():  # a file where a folder must be
        fail(f"{flag}: cannot write {path}: {existing} is a file, not a folder")
    if Path(path).is_dir():
        fail(f"{flag}: cannot write {path}: it is a folder (give a file path)")
    try:  # a real write: os.access says yes to root, even on /proc
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dflash2-probe-"):
            pass
    except OSError as exc:
        fail(f"{flag}: cannot write {path}: {existing} is not writable ({exc.strerror or exc})")
    finally:  # the run makes them when it writes: a failed run leaves no empty folders
        for up in missing:
            with contextlib.suppress(OSError):
                up.rmdir()


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
ModelArg = Annotated[
    Optional[str],
    typer.Argument(
        help="A model alias (see `dflash2 models`); default: smollm2-135m, the embedded model.",
        show_default=False,
    ),
]
TargetOpt = Annotated[
    Optional[str],
    typer.Option(
        "--target",
        help="Target model: an mlx-lm folder or a Hugging Face repo id "
        "(replaces the alias's target).",
    ),
]
DrafterOpt = Annotated[
    Optional[str],
    typer.Option(
        "--drafter",
        help="DFlash / DFlash2 drafter: a folder or a Hugging Face repo id "
        "(replaces the alias's drafter).",
    ),
]

ThinkingOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--thinking/--no-thinking",
        help="Turn a Qwen-style template's thinking on or off (default: the template's own).",
        show_default=False,
    ),
]
OfflineOpt = Annotated[
    bool,
    typer.Option(
        "--offline", help="Never download: use folders and the local Hugging Face cache only."
    ),
]
FullVocabOpt = Annotated[
    bool,
    typer.Option(
        "--full-vocab",
        help="Draft from the whole vocabulary, not the drafter's draft vocabulary "
        "(draft_vocab.json: a smaller, cheaper draft head; outputs are the same either way).",
    ),
]
DraftVocabOpt = Annotated[
    Optional[int],
    typer.Option(
        "--draft-vocab",
        min=1,
        metavar="N",
        help="Draft from only the N most frequent tokens of "
        "the draft vocabulary: a smaller draft head, cheaper rounds; outputs are the same (`dflash2 "
        "bench` measures the trade). At least 16 (the selector's top-K) for a DFlash 2 drafter.",
        show_default=False,
    ),
]
ChatTemplateOpt = Annotated[
    Optional[str],
    typer.Option(
        "--chat-template",
        metavar="FILE|TEXT",
        help="A Jinja chat template in place of the model's (or for a model that has none): a "
        "file (.jinja, or a tokenizer_config.json holding one) or the template's text.",
        show_default=False,
    ),
]
BlockOpt = Annotated[
    Optional[int],
    typer.Option(
        "--block",
        help="Block size: tokens verified per round (default: this machine's autotune "
        "profile from `dflash2 bench --autotune`, else the alias's recommendation, else the "
        "drafter's trained block size).",
        show_default=False,
    ),
]
NoSpecOpt = Annotated[
    bool,
    typer.Option(
        "--no-spec",
        help="Plain decoding, same sampler: for comparison (the pair still loads; in a chat, "
        "/spec on drafts again; a server stays plain).",
    ),
]
LookupOpt = Annotated[
    Optional[int],
    typer.Option(
        "--lookup",
        min=0,
        max=64,
        metavar="N",
        help="Context lookup: when the last N tokens occurred "
        "earlier in the prompt or answer, propose what followed them instead of drafting (free, "
        f"often long and right; outputs are the same). 0: always the drafter. [default: "
        f"{DEFAULT_LOOKUP}]",
        show_default=False,
    ),
]
NoDatastoreOpt = Annotated[
    bool,
    typer.Option(
        "--no-datastore",
        help="Do not draft from the drafter's response datastore (datastore.npz: its "
        "training answers; when context lookup finds nothing, it proposes the continuation "
        "of the last 3+ tokens there that most answers agree on; free, outputs are the same).",
    ),
]

# Sampling: chat uses these for every turn, serve for the fields a request leaves out. Not
# given: the target's generation_config.json, else greedy (dflash2_mlx.settings).
_FROM_MODEL = " [default: the target's generation_config.json, else greedy]"
TempOpt = Annotated[
    Optional[float],
    typer.Option(
        "--temp", help="Sampling temperature; 0 = greedy." + _FROM_MODEL, show_default=False
    ),
]
TopPOpt = Annotated[
    Optional[float],
    typer.Option(
        "--top-p", help="Nucleus sampling mass, in [0, 1]." + _FROM_MODEL, show_default=False
    ),
]
TopKOpt = Annotated[
    Optional[int],
    typer.Option(
        "--top-k", help="Keep the k most likely tokens; 0 = off." + _FROM_MODEL, show_default=False
    ),
]
MinPOpt = Annotated[
    Optional[float],
    typer.Option(
        "--min-p",
        help="Drop tokens below min_p x the top probability, in [0, 1]." + _FROM_MODEL,
        show_default=False,
    ),
]
SeedOpt = Annotated[
    Optional[int],
    typer.Option(
        "--seed",
        help="Random seed for sampling [default: none: each generation draws its own].",
        show_default=False,
    ),
]


def sampling_flags(temp, top_p, top_k, min_p, seed) -> dict:
    """The sampling options as dflash2_mlx.settings names them (None: not given)."""
    return {"temperature": temp, "top_p": top_p, "top_k": top_k, "min_p": min_p, "seed": seed}


def engine_flags(
    *,
    block=None,
    spec=True,
    lookup=None,
    datastore=True,
    full_vocab=False,
    draft_vocab=None,
    sampling=None,
    chat_template=None,
):
    """The engine options as given, checked (contradictions refused) before any model loads;
    `chat_template` as given (a file or the template's text) is read here."""
    from dflash2_mlx.chat_template import read_chat_template
    from dflash2_mlx.settings import EngineFlags

    return EngineFlags(
        block=block,
        speculative=spec,
        lookup=lookup,
        datastore=datastore,
        full_vocab=full_vocab,
        draft_vocab=draft_vocab,
        sampling=sampling or {},
        chat_template=None if chat_template is None else read_chat_template(chat_template),
    )


def given_params(ctx) -> frozenset[str]:
    """The parameters the command line (or the environment) set, not their defaults: click's
    parameter sources, compared by name (typer may carry its own copy of the enum)."""
    sources = {name: ctx.get_parameter_source(name) for name in ctx.params}
    return frozenset(
        n for n, s in sources.items() if getattr(s, "name", "") in ("COMMANDLINE", "ENVIRONMENT")
    )
