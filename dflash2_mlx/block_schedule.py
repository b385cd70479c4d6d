"""The autotuned block by context length.

A verify's cost per extra token grows with the context (attention reads every cached key for
each verified token), and so does a draft pass: on this project's CPU, SmolLM2-135M at width 4
costs 1.25x a one-token forward at 256 tokens of context and 1.68x at 4,096
(docs/results/smollm2-verify-cost-by-context.json), so a block chosen at a short context can
lose to plain decoding in a long conversation or over a long document. The autotuner measures
the verify and draft costs at a second, longer context too; costs in between and beyond are
linear in the context through the two (attention is), and at each context the block with the
most expected tokens per second (autotune.choose_block, the same acceptance) is picked. The
result is GenerationParams.block_by_context: ((context, block), ...) where the choice falls
(docs/results/smollm2-long-context-block.json: +3-9 % in total at 2-5k tokens of context).
"""

from __future__ import annotations

from typing import Callable, Mapping

# Contexts at which the choice is made: every STEP tokens past the short measurement.
STEP = 256
# The second measurement's context: this, or half the model's context if that is shorter
# (at least twice the first's, else no schedule).
LONG_CONTEXT = 2048
# The schedule reaches this many times the second measurement's context at most (beyond, its
# last block holds): a slope measured at 2,048 tokens says little about 100k.
EXTRAPOLATE = 4


def long_context(context: int, max_context: int) -> int | None:
    """The context of the second measurement, or None when the model's is too short."""
    long = min(LONG_CONTEXT, max_context // 2)
    return long if long >= 2 * context else None


def costs_at(
    context: int, short: tuple[int, Mapping[int, float]], long: tuple[int, Mapping[int, float]]
) -> dict[int, float]:
    """Each width's cost at `context`, linear through the costs measured at two contexts."""
    (c0, a), (c1, b) = short, long
    t = (context - c0) / (c1 - c0)
    return {w: float(a[w]) + (float(b[w]) - float(a[w])) * t for w in a if w in b}


def monotone(
    short: tuple[int, Mapping[int, float]], long: tuple[int, Mapping[int, float]]
) -> tuple[tuple[int, dict[int, float]], tuple[int, dict[int, float]]]:
    """The two measurements with what timing noise breaks put back: a wider verify (a larger
    block) costs no less than a narrower one, and no width costs less at the longer context."""

    def rising(ms: Mapping[int, float], floor: Mapping[int, float]) -> dict[int, float]:
        out, top = {}, 0.0
        for w in sorted(ms):
            top = max(top, float(ms[w]), float(floor.get(w, 0.0)))
            out[w] = top
        return out

    (c0, a), (c1, b) = short, long
    a = rising(a, {})
    return (c0, a), (c1, rising(b, a))


def block_schedule(
    verify: tuple[tuple[int, Mapping[int, float]], tuple[int, Mapping[int, float]]],
    draft: tuple[tuple[int, Mapping[int, float]], tuple[int, Mapping[int, float]]],
    best: Callable[[dict[int, float], dict[int, float]], int],
    until: int,
    first: int,
) -> list[list[int]]:
    """[[context, block], ...]: from each context on (up to `until`), the block `best` picks
    from that context's verify and draft costs, listed where it falls below the one before
    (`first`: the block chosen at the short context). `verify`, `draft`: (short, long)
    measurements as (context, {width or block: ms}), made monotone first. Blocks only fall
    as the context grows (attention's share of a wider verify only grows): what a noisy
    measurement would make rise is held."""
    verify, draft = monotone(*verify), monotone(*draft)
    start = verify[0][0]

    def at(context: int) -> int:
        return best(costs_at(context, *verify), costs_at(context, *draft))

    out, current = [], first
    for context in range(start + STEP, until + 1, STEP):
        block = at(context)
        if block < current:
            out.append([context, block])
            current = block
    return out


def measure_schedule(
    pair,
    short_verify: Mapping[int, float],
    short_draft: Mapping[int, float],
    best: Callable[[dict[int, float], dict[int, float]], int],
    *,
    first: int,
    context: int,
    repeats: int,
    say: Callable[[str], None],
) -> dict | None:
    """The profile's `long_context` section: the verify and draft costs at a second, longer
    context and the schedule they give (None: the model's context is too short for one)."""
    from . import costs
    from .target.context import default_context_length

    max_context = default_context_length(pair.model)
    long = long_context(context, max_context)
    if long is None:
        return None
    widths = sorted(short_verify)
    say(f"verify and draft cost at context {long}")
    verify = costs.verify_costs(pair, widths, context=long, repeats=repeats)["ms"]
    draft = costs.draft_costs(pair, sorted(short_draft), context=long, repeats=repeats)["ms"]
    schedule = block_schedule(
        ((context, short_verify), (long, verify)),
        ((context, short_draft), (long, draft)),
        best,
        min(max_context, EXTRAPOLATE * long),
        first,
    )
    return {
        "context": long,
        "verify_ms": {str(w): ms for w, ms in verify.items()},
        "draft_ms": {str(b): ms for b, ms in draft.items()},
        "block_by_context": schedule,
    }
