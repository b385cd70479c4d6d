"""Block-size autotuning: measure, decide, remember.

`autotune(pair, prompts, ...)` measures on this machine
- the target's verify cost for widths 1..B (dflash2_mlx.costs.verify_costs: dependent chain,
  medians, warm cache at a context depth),
- the drafter's cost per round for blocks 1..B (costs.draft_costs; block 1 drafts nothing),
- the per-position acceptance on a greedy calibration run at block B (calibration.py):
  p_k = P(draft k accepted | drafts 1..k-1 accepted), counted from the engine's per-round
  accepted counts,
and picks the block b <= B that maximizes expected committed tokens per second,

    E[tokens/round at b] / (draft_ms(b) + verify_ms(b)),   E = 1 + sum_{k<b} prod_{j<=k} p_j

(`choose_block`, a pure function). The acceptance measured at block B stands in for every
smaller block (draft k is assumed as likely to be accepted at block b > k as at B); only drafter
rounds count. Block 1 (no drafter pass, "park") is a candidate.

The same choice at every context up to the model's, with the verify and draft costs measured
at a second, longer context too (block_schedule.py), gives `block_by_context`: where a longer
context makes a smaller block pay (GenerationParams.block_by_context).

Sampled rounds accept less: the calibration runs again at each of
calibration.SAMPLED_TEMPERATURES (seeded), and where the block those rounds make best falls
below the greedy one, `block_by_temperature` lists it (a request at that temperature or above
uses it: settings.block_for_temperature).

Rounds drafted by context lookup run no draft pass and have their own limit, the lookup block
L (GenerationParams.lookup_block): the calibration runs them at the widest candidate, and
`choose_lookup_block` picks the L that maximizes their committed tokens per verify ms, each
round replayed as if cut at L (it would propose min(d, L - 1) tokens and commit
min(a, L - 1) + 1), costed on the verify curve measured up to the widest candidate
(`recommended_lookup_block` finds it again).

When the target or the drafter has quantized matmuls (QuantizedLinear / QuantizedEmbedding or
any layer with `bits` and `group_size`), the block is capped at 5: a quantized verify is cheap per token but its cost grows fast with
width on MLX (z-lab's MLX instructions run their 4-bit targets at block 5).

The profile is stored (dflash2_mlx/profiles.py) as JSON under `cache_root()/autotune`, keyed by device (chip, and the
BLAS on CPU), mlx version, target, drafter and quantization signature (bits, group size, mode
and weight dtype of each model); `recommended_block(pair, target, drafter)` finds it again for
`chat` and `serve`, and returns None when any part of the key differs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping, Sequence

# Re-exported: callers reach the profiles and the quantization signature through autotune.
from .profiles import (  # noqa: F401
    SCHEMA,
    check_storable,
    device_key,
    load_profile,
    profile_dir,
    profile_key,
    profile_path,
    recommended_block,
    recommended_lookup_block,
    save_profile,
)
from .block_schedule import measure_schedule
from .calibration import (  # noqa: F401 - acceptance_probs re-exported
    MIN_ROUNDS,
    check_rounds,
    SAMPLED_TEMPERATURES,
    acceptance_probs,
    calibrate,
    falling_blocks,
)
from .batch_costs import verify_at  # noqa: F401 - re-exported
from .block_rules import QUANT_CAP
from .engine.width import MEASURED_WIDTHS
from .errors import ParameterError
from .quant import describe_quant, is_quantized, quant_signature, quantized_layers, weight_dtype  # noqa: F401

# Lookup-block candidates measured beyond the drafter's blocks (tokens verified per round).
LOOKUP_WIDTHS = (4, 6, 8, 12, 16, 24, 32)
# Row counts and widths of the batched engine's verify cost table (widths cut to those measured
# for one row); the width rule interpolates between them (batch_costs.width_costs). Up to the
# server's default batch (defaults.MAX_BATCH): beyond 48 rows a product leaves the few-row
# kernel on x86, so 8 rows do not cost what 2 and 4 extrapolate to.
BATCH_ROWS = (2, 4, 8)
BATCH_WIDTHS = MEASURED_WIDTHS  # the batch table's widths: the width rule compares them


# ----------------------------------------------------------------------------- the decision
def expected_tokens(probs: Sequence[float], block: int) -> float:
    """E[committed tokens per round] at `block`: 1 (the bonus) + sum over drafts k < block of
    P(drafts 1..k all accepted)."""
    total, run = 1.0, 1.0
    for k in range(1, block):
        run *= probs[k - 1] if k - 1 < len(probs) else 0.0
        total += run
    return total


@dataclass(frozen=True)
class BlockRow:
    block: int
    verify_ms: float
    draft_ms: float
    round_ms: float
    expected_tokens: float
    expected_tps: float
    allowed: bool  # within max_block and the quantization cap


@dataclass(frozen=True)
class Choice:
    block: int
    rows: list[BlockRow]
    cap: int | None  # the quantization cap in force, if any

    def as_dict(self) -> dict:
        return {"block": self.block, "cap": self.cap, "rows": [asdict(r) for r in self.rows]}


def choose_block(
    verify_ms: Mapping[int, float],
    draft_ms: Mapping[int, float],
    probs: Sequence[float],
    *,
    max_block: int,
    cap: int | None = None,
    draft_share: float = 1.0,
) -> Choice:
    """The block b in 1..min(max_block, cap) maximizing E[tokens/round at b] / (draft_share *
    draft_ms(b) + verify_ms(b)) (ties: the smaller block); draft_share: the share of the
    rounds in `probs` that run the drafter (1 when probs count drafter rounds only, as
    `autotune` does: lookup rounds are priced apart, by choose_lookup_block). Blocks
    without both costs are skipped. Rows report the expected draft ms per round."""
    limit = min(max_block, cap) if cap else max_block
    rows: list[BlockRow] = []
    for b in range(1, max_block + 1):
        if b not in verify_ms or (b > 1 and b not in draft_ms):
            continue
        v = float(verify_ms[b])
        d = draft_share * float(draft_ms[b]) if b > 1 else 0.0
        e = expected_tokens(probs, b)
        ms = v + d
        tps = 1000.0 * e / ms if ms > 0 else 0.0
        rows.append(
            BlockRow(
                b, round(v, 4), round(d, 4), round(ms, 4), round(e, 4), round(tps, 3), b <= limit
            )
        )
    allowed = [r for r in rows if r.allowed]
    if not allowed:
        raise ValueError("no block size has both a verify and a draft cost")
    best = max(allowed, key=lambda r: (r.expected_tps, -r.block))
    return Choice(best.block, rows, cap)


@dataclass(frozen=True)
class LookupRow:
    lookup_block: int
    verify_ms: float  # mean verify cost of a lookup round cut at this block
    expected_tokens: float  # mean tokens committed by such a round
    expected_tps: float


@dataclass(frozen=True)
class LookupChoice:
    lookup_block: int | None  # None: no lookup round to measure
    rows: list[LookupRow]
    rounds: int

    def as_dict(self) -> dict:
        return {
            "lookup_block": self.lookup_block,
            "rounds": self.rounds,
            "rows": [asdict(r) for r in self.rows],
        }


def choose_lookup_block(
    verify_ms: Mapping[int, float], rounds: Iterable[tuple[int, int]], candidates: Iterable[int]
) -> LookupChoice:
    """The lookup block L (tokens verified in a lookup round) maximizing the lookup rounds'
    committed tokens per verify ms (ties: the larger L: a wider limit costs nothing where no
    repeat is that long). `rounds`: (drafted, accepted) of
    lookup rounds run at a block at least as wide as every candidate; cut at L, a round
    proposes min(d, L - 1) tokens, commits min(a, L - 1) + 1 and costs verify(min(d, L-1) + 1)
    (`verify_at`). No rounds: no choice (lookup_block None)."""
    rounds = list(rounds)
    if not rounds:
        return LookupChoice(None, [], 0)
    rows = []
    for L in sorted({int(c) for c in candidates if c >= 2}):
        tokens = sum(min(a, L - 1) + 1 for _, a in rounds) / len(rounds)
        ms = sum(verify_at(verify_ms, min(d, L - 1) + 1) for d, _ in rounds) / len(rounds)
        tps = 1000.0 * tokens / ms if ms > 0 else 0.0
        rows.append(LookupRow(L, round(ms, 4), round(tokens, 4), round(tps, 3)))
    best = max(rows, key=lambda r: (r.expected_tps, r.lookup_block))
    return LookupChoice(best.lookup_block, rows, len(rounds))


# ----------------------------------------------------------------------------- measurement
# Lookup rounds a lookup block is chosen from (the 7 bench prompts give ~60 at 128 tokens).
MIN_LOOKUP_ROUNDS = 10


def _lookup_profile(pair, verify_ms: Mapping[int, float], calib: Mapping, widths) -> dict:
    """The lookup-block part of a profile: the choice, its table and the costs behind it."""
    rounds = [(d, a) for d, a, n in calib.get("lookup_counts", []) for _ in range(n)]
    choice = choose_lookup_block(verify_ms, rounds, widths)
    chosen = choice.lookup_block
    if not pair.decoder.lookup:
        reason = "context lookup is off (--lookup 0)"
    elif chosen is None:
        reason = "no lookup round in the calibration (nothing repeated)"
    elif choice.rounds < MIN_LOOKUP_ROUNDS:  # a choice from a round or two is noise
        chosen = None
        reason = (
            f"{choice.rounds} lookup rounds in the calibration, fewer than the "
            f"{MIN_LOOKUP_ROUNDS} a lookup block is chosen by: the engine's default stays"
        )
    else:
        reason = f"best measured tokens per verify ms over {choice.rounds} lookup rounds"
    return {
        "candidates": sorted(widths),
        "calibration_block": calib.get("lookup_block"),
        "verify_ms": {str(w): verify_ms[w] for w in sorted(verify_ms)},
        "table": [asdict(r) for r in choice.rows],
        "chosen": chosen,
        "reason": reason,
    }


def autotune(
    pair,
    prompts,
    *,
    target: str,
    drafter: str,
    max_block: int | None = None,
    context: int = 256,
    repeats: int = 5,
    max_tokens: int = 128,
    thinking: bool | None = None,
    progress: Callable[[str], None] | None = None,
    batches: Sequence[int] | None = None,
) -> dict:
    """Measure and decide; returns the profile (not stored: see save_profile).
    `batches`: row counts whose verify cost over widths is measured for the batched engine's
    width cap (costs.batch_verify_costs; None: BATCH_ROWS, (): none)."""
    from . import costs

    say = progress or (lambda _msg: None)
    B, trained = _checked_max_block(pair, max_block)
    key = profile_key(pair, target, drafter)
    cap, cap_reason = _quant_cap(key, B)
    lookup_widths = sorted(set(range(2, B + 1)) | set(LOOKUP_WIDTHS)) if pair.decoder.lookup else []
    widths = sorted(set(range(1, B + 1)) | set(lookup_widths))
    calibrate_at = _calibrator(pair, prompts, B, max_tokens, thinking, say)
    say(f"calibration: greedy at block {B} on {len(prompts)} prompts")
    calib = calibrate_at(0.0, max(lookup_widths, default=B))
    if B > 1:  # block 1 drafts nothing: one block to choose, no rounds to count
        check_rounds(calib, len(prompts), max_tokens)
    measured = costs.measure_costs(
        pair,
        widths,
        blocks=range(1, B + 1),
        batches=BATCH_ROWS if batches is None else tuple(batches),
        batch_widths=[w for w in BATCH_WIDTHS if w <= max(widths)],
        context=context,
        repeats=repeats,
        say=say,
    )
    costs.check_plausible(measured.verify["ms"])
    block_ms = {w: measured.verify["ms"][w] for w in range(1, B + 1)}
    decisions = _decisions(
        pair, calibrate_at, calib, measured, block_ms, lookup_widths, B, cap, context, repeats, say
    )
    return {
        "schema": SCHEMA,
        "key": key,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "max_block": B,
        "trained_block": trained,
        "cap": cap,
        "cap_reason": cap_reason,
        **_cost_sections(measured, block_ms, context, repeats),
        "acceptance": calib,
        **decisions,
    }


def _calibrator(pair, prompts, B: int, max_tokens: int, thinking, say) -> Callable[..., dict]:
    """calibrate_at(temperature, lookup_block): the calibration at block B on `prompts`."""
    return lambda temperature, lookup_block: calibrate(
        pair,
        prompts,
        B,
        lookup_block=lookup_block,
        max_tokens=max_tokens,
        thinking=thinking,
        temperature=temperature,
        progress=lambda i, n: say(f"calibration {i}/{n}"),
    )


def _decisions(
    pair, calibrate_at, calib, measured, block_ms, lookup_widths, B, cap, context, repeats, say
) -> dict:
    """The profile's choices from the measured costs and the greedy calibration `calib`: the
    block and its table, the lookup block, the sampled calibrations and the long context."""

    def best(probs) -> int:
        return choose_block(block_ms, measured.draft["ms"], probs, max_block=B, cap=cap).block

    choice = choose_block(
        block_ms, measured.draft["ms"], calib["position_probs"], max_block=B, cap=cap
    )
    lookup = _lookup_profile(pair, measured.verify["ms"], calib, lookup_widths)
    sampled = _sampled_section(lambda t: calibrate_at(t, B), best, choice.block, say)
    long = measure_schedule(
        pair,
        block_ms,
        measured.draft["ms"],
        lambda v, d: choose_block(v, d, calib["position_probs"], max_block=B, cap=cap).block,
        first=choice.block,
        context=context,
        repeats=repeats,
        say=say,
    )
    return {
        "table": [asdict(r) for r in choice.rows],
        "chosen_block": choice.block,
        "lookup": lookup,
        "chosen_lookup_block": lookup["chosen"],
        "long_context": long,
        "block_by_context": long["block_by_context"] if long else [],
        **sampled,
    }


def _sampled_section(
    calibrate_at: Callable[[float], dict], best: Callable[[list], int], first: int, say
) -> dict:
    """The profile's `sampled` calibrations (one per SAMPLED_TEMPERATURES, drafter rounds at
    the largest block), each with the block its acceptance makes best (None, with the reason,
    when too few drafter rounds ran to choose by), and `block_by_temperature`: where those
    fall below `first`, the greedy choice."""
    sampled = []
    for t in SAMPLED_TEMPERATURES:
        say(f"calibration: temperature {t}")
        c = {**calibrate_at(t), "temperature": t, "chosen_block": None}
        if c["rounds"] >= MIN_ROUNDS:
            c["chosen_block"] = best(c["position_probs"])
        else:
            c["reason"] = f"{c['rounds']} drafter rounds, fewer than {MIN_ROUNDS}"
        sampled.append(c)
    chosen = [(c["temperature"], c["chosen_block"]) for c in sampled if c["chosen_block"]]
    return {"sampled": sampled, "block_by_temperature": falling_blocks(chosen, first)}


def _quant_cap(key: Mapping, max_block: int) -> tuple[int | None, str | None]:
    """The block cap for quantized matmuls and why (None, None: unquantized, or within it)."""
    if not (is_quantized(key["quantization"]) and max_block > QUANT_CAP):
        return None, None
    why = f"quantized matmuls ({describe_quant(key['quantization'])}): block capped at {QUANT_CAP}"
    return QUANT_CAP, why


def _checked_max_block(pair, max_block: int | None) -> tuple[int, int]:
    """(largest block considered, the drafter's trained block); ParameterError past trained."""
    trained = pair.drafter.config.block_size
    B = int(max_block or trained)
    if not 1 <= B <= trained:
        raise ParameterError(
            f"block {B} must be in 1..{trained} (the drafter's trained block size)"
        )
    return B, trained


def _cost_sections(measured, block_ms: dict[int, float], context: int, repeats: int) -> dict:
    """The profile's verify (block widths only), batch_verify and draft sections."""
    return {
        "verify": {
            "context": context,
            "repeats": repeats,
            "ms": {str(k): v for k, v in block_ms.items()},
            "ratio": {str(k): measured.verify["ratio"][k] for k in block_ms},
        },
        "batch_verify": {
            "context": context,
            "ms": {
                str(b): {str(w): ms for w, ms in row.items()}
                for b, row in measured.batch_verify["ms"].items()
            },
        },
        "draft": {
            "ms": {str(k): v for k, v in measured.draft["ms"].items()},
            "feature_rows": measured.draft["feature_rows"],
        },
    }
