"""Engine settings, resolved once and the same way for every front end (chat, serve, bench).

Front ends parse their flags into `EngineFlags` and render what `resolve_engine` returns; the
rules live here and nowhere else:
- contradicting flags (--full-vocab with --draft-vocab) are refused, naming the flags (a
  drafting flag beside --no-spec is the front end's to refuse: chat can turn speculation on
  later, `cli/common.spec_engine_flags`);
- the response datastore (engine/datastore.py): on when the drafter ships one, unless
  --no-datastore;
- the block size: --block, else this machine's autotune profile (`dflash2 bench --autotune`),
  else the alias's recommendation, else the drafter's trained size. An explicit block above
  the trained size is an error; a recommendation above it is clamped. The reason is kept.
  The profile's own block falls where it measured a smaller one pays: from a context length
  on (block_by_context) and, for sampled requests, from a temperature on (block_for_temperature;
  these rules are block_rules.py's);
- the lookup block (tokens verified in a lookup or prediction round): the autotune profile,
  else the engine's default;
- sampling defaults, field by field: the flag, else the target's generation_config.json
  (`do_sample: false` means greedy), else greedy. A request (serve) or a slash command
  (chat) overrides them field by field; a request's own fields always win.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from .block_rules import (  # noqa: F401 - the front ends import them from here
    BY_ALIAS,
    BY_FLAG,
    BY_PROFILE,
    BY_QUANT_CAP,
    BY_TRAINED,
    QUANT_CAP,
    BlockChoice,
    Drafting,
    block_for_temperature,
    check_block,
    check_falling,
    choose_block,
)
from .engine.lookup import DEFAULT_LOOKUP
from .sampling import SamplingParams, field_problem
from .errors import ConfigError, ParameterError
from .values import is_int

# SamplingParams field -> its flag in `dflash2 chat` and `dflash2 serve`.
SAMPLING_FLAGS = {
    "temperature": "--temp",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "seed": "--seed",
}
GENERATION_CONFIG = "generation_config.json"
CONFIG_FIELDS = ("temperature", "top_p", "top_k", "min_p")  # read from it (never a seed)
DEFAULT_SOURCE = "default"


# ----------------------------------------------------------------------------- sampling
def check_sampling(
    given: Mapping[str, Any], names: Mapping[str, str] = SAMPLING_FLAGS
) -> dict[str, Any]:
    """The fields that were given (None = not given), each checked; errors use `names`
    (field -> how the user wrote it: a flag, a request field)."""
    out = {}
    for name, value in given.items():
        if name not in SAMPLING_FLAGS:
            raise ParameterError(
                f"unknown sampling field {name!r}; expected one of {', '.join(SAMPLING_FLAGS)}"
            )
        if value is None:
            continue
        problem = field_problem(name, value)
        if problem:
            raise ParameterError(f"{names.get(name, name)}: {problem}, got {value!r}")
        out[name] = value
    return out


def generation_config(target_dir: str | Path | None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The sampling fields the target's generation_config.json sets (those in `skip`, which
    flags give, are not read). `do_sample: false` means greedy (temperature 0); other fields
    still count, as in transformers when a caller asks for sampling. No file: {}."""
    if target_dir is None:
        return {}
    path = Path(target_dir) / GENERATION_CONFIG
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(cfg).__name__}")
    do_sample = cfg.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ConfigError(f"{path}: field 'do_sample' must be true or false, found {do_sample!r}")
    out: dict[str, Any] = {}
    for name in CONFIG_FIELDS:
        value = 0.0 if name == "temperature" and do_sample is False else cfg.get(name)
        if name in skip or value is None:
            continue
        problem = field_problem(name, value)
        if problem:
            raise ConfigError(
                f"{path}: field '{name}': {problem}, found {value!r} (pass "
                f"{SAMPLING_FLAGS[name]} to use another value)"
            )
        out[name] = value
    return out


@dataclass(frozen=True)
class SamplingDefaults:
    """What a turn or request gets for each sampling field it leaves out, and from where."""

    params: SamplingParams = SamplingParams()
    sources: tuple[tuple[str, str], ...] = ()  # (field, a flag or GENERATION_CONFIG)

    def source(self, name: str) -> str:
        return dict(self.sources).get(name, DEFAULT_SOURCE)

    @property
    def from_flags(self) -> tuple[str, ...]:
        return tuple(n for n, src in self.sources if src == SAMPLING_FLAGS[n])

    def complete(self, given: Mapping[str, Any]) -> SamplingParams:
        """These defaults with the fields `given` (None: not given) in their place."""
        return replace(self.params, **check_sampling(given, {}))

    def describe(self) -> str:
        """E.g. 'greedy (default)' or 'temperature 0.6, top_p 0.95 (generation_config.json)'."""
        p = self.params
        if p.greedy:
            return f"greedy ({self.source('temperature')})"
        neutral = SamplingParams()
        groups: dict[str, list[str]] = {}
        for name in SAMPLING_FLAGS:
            value = getattr(p, name)
            if name == "temperature" or value != getattr(neutral, name):
                groups.setdefault(self.source(name), []).append(f"{name} {value}")
        return "; ".join(f"{', '.join(parts)} ({src})" for src, parts in groups.items())

    def to_json(self) -> dict:
        """The values and, per field, where each came from (for /v1/models)."""
        return {
            **{n: getattr(self.params, n) for n in SAMPLING_FLAGS},
            "source": {n: self.source(n) for n in SAMPLING_FLAGS},
        }


def idle_when_greedy(params: SamplingParams) -> list[str]:
    """The fields set away from neutral that greedy decoding ignores (worth a note)."""
    if not params.greedy:
        return []
    neutral = SamplingParams()
    return [
        n
        for n in SAMPLING_FLAGS
        if n != "temperature" and getattr(params, n) != getattr(neutral, n)
    ]


def resolve_sampling(
    flags: Mapping[str, Any], target_dir: str | Path | None = None
) -> SamplingDefaults:
    """Per field: the flag, else the target's generation_config.json, else greedy."""
    given = check_sampling(flags)
    sources = {n: SAMPLING_FLAGS[n] for n in given}
    from_config = generation_config(target_dir, skip=tuple(given))
    sources.update((n, GENERATION_CONFIG) for n in from_config)
    params = SamplingParams(**{**from_config, **given})
    return SamplingDefaults(params, tuple((n, sources[n]) for n in SAMPLING_FLAGS if n in sources))


# ----------------------------------------------------------------------------- everything
@dataclass(frozen=True)
class EngineFlags:
    """The engine options as a front end was given them (None / False: not given).
    Contradictions and bad values are refused here, before any model loads (drafting options
    beside `speculative` False are the front end's call: chat can turn speculation on)."""

    block: int | None = None
    speculative: bool = True
    lookup: int | None = None
    datastore: bool = True  # the drafter's datastore when it ships one (False: --no-datastore)
    full_vocab: bool = False
    draft_vocab: int | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)  # field -> value (None: not given)
    chat_template: str | None = None  # its text, in place of the target's (read_chat_template)

    def __post_init__(self):
        for name in ("speculative", "datastore", "full_vocab"):
            if not isinstance(getattr(self, name), bool):
                raise ParameterError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.sampling, Mapping):
            raise ParameterError(
                f"sampling must be a mapping of field -> value, got {type(self.sampling).__name__}"
            )
        if self.full_vocab and self.draft_vocab is not None:
            raise ParameterError("--draft-vocab and --full-vocab contradict each other")
        if self.block is not None:
            check_block(self.block)
        for flag, value, low in (
            ("--lookup", self.lookup, 0),
            ("--draft-vocab", self.draft_vocab, 1),
        ):
            if value is not None and not is_int(value, low):
                raise ParameterError(f"{flag} must be an int >= {low}, got {value!r}")
        check_sampling(self.sampling)

    @property
    def lookup_or_default(self) -> int:
        return DEFAULT_LOOKUP if self.lookup is None else self.lookup


@dataclass(frozen=True)
class EngineSettings:
    """What every turn or request of a front end runs with (a request may override sampling)."""

    speculative: bool
    block: BlockChoice  # the block when speculative (chat can switch speculation on)
    auto_block: BlockChoice  # the block without --block (chat's `/block auto`)
    lookup: int  # context lookup: min_match, 0 = off
    datastore: bool  # the response datastore drafts (when lookup and the prediction do not)
    sampling: SamplingDefaults
    # Tokens verified in a lookup or prediction round: this machine's autotune profile, else
    # None (the engine's DEFAULT_LOOKUP_BLOCK). GenerationParams.lookup_block.
    lookup_block: int | None = None
    # cost(rows, width) of one batched verify from this machine's autotune profile, else None
    # (engine/width.py's default model). Chooses each batched round's width cap.
    width_cost: Callable[[int, int], float] | None = None
    # One sequence's verify cost(context, width) from the profile, else None
    # (GenerationParams.verify_cost).
    verify_cost: Callable[[int, int], float] | None = None

    @property
    def effective_block(self) -> int:
        """Tokens a greedy drafter round verifies at the start of a reply (1 when speculative
        decoding is off): the block before any schedule by context or temperature."""
        return self.drafting.block_now(0.0, 0, self.block.size)

    @property
    def drafting(self) -> Drafting:
        """What every generation drafts with (Drafting.fields)."""
        return Drafting.of(self.speculative, self.block, self.lookup_block, self.verify_cost)


QUANTIZED_CPU = (
    "quantized weights on the CPU: MLX's CPU quantized matmul costs about a whole forward per "
    "verified token, so drafting may run slower than plain decoding here; `dflash2 bench "
    "--autotune` measures it and picks the block (1: plain)"
)


def _quantized_advice(auto: BlockChoice, pair, said: bool) -> BlockChoice:
    """An unmeasured block for a quantized target: capped at QUANT_CAP (an alias recommends
    16 for its bf16 target; a 4-bit copy of it verifies that width slowly), and where it is
    what runs (`said`: no --block, speculation on), the note saying why, on the CPU with the
    advice to measure it."""
    import mlx.core as mx

    from .quant import quantized_layers

    if not quantized_layers(pair.model):
        return auto
    advice = [QUANTIZED_CPU] if mx.default_device() == mx.cpu else []
    if auto.size > QUANT_CAP:
        asked = auto.clamped_from or auto.size  # an alias's 16, past a drafter trained on 8
        advice.insert(
            0,
            f"quantized target: block {QUANT_CAP}, not the {auto.reason}'s {asked} (a "
            "quantized verify slows with its width); `dflash2 bench --autotune` measures this "
            "machine's",
        )
        auto = replace(auto, size=QUANT_CAP, reason=BY_QUANT_CAP, clamped_from=None)
    return replace(auto, advice="; ".join(advice)) if advice and said else auto


def resolve_engine(
    flags: EngineFlags, pair, resolved, target_dir: str | Path | None
) -> EngineSettings:
    """Settings for a loaded `pair` (dflash2_mlx.api.Pair) of `resolved` (a registry
    ResolvedPair) whose target lives in `target_dir`."""
    from .profiles import profile_advice

    trained = pair.drafter.config.block_size
    advice = profile_advice(pair, resolved.target, resolved.drafter)
    auto = choose_block(
        trained,
        profile=advice.block,
        alias=resolved.block_size,
        by_context=advice.by_context,
        by_temperature=advice.by_temperature,
        ignored_profile=advice.damaged,
    )
    if auto.reason in (BY_ALIAS, BY_TRAINED):  # unmeasured (`/block auto` takes it too)
        auto = _quantized_advice(auto, pair, flags.block is None and flags.speculative)
    block = choose_block(trained, flag=flags.block) if flags.block is not None else auto
    return EngineSettings(
        flags.speculative,
        block,
        auto,
        pair.decoder.lookup,
        pair.decoder.datastore is not None,
        resolve_sampling(flags.sampling, target_dir),
        advice.lookup_block,
        advice.width_cost,
        advice.verify_cost,
    )
