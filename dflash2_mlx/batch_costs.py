"""The batched engine's verify cost over (rows, width), from a stored autotune profile.

The autotuner measures one verify forward over B rows of width W (costs.batch_verify_costs,
beside costs.verify_costs for one row) and stores the table in the profile ("batch_verify").
`width_costs` turns a profile into the cost(rows, width) of engine/width.py's width rule
(None when the profile has no table: the rule's default cost model applies); `context_costs`
into one sequence's cost(context, width) (GenerationParams.verify_cost), from the verify costs
it measured at two contexts.
"""

from __future__ import annotations

from typing import Callable, Mapping


def verify_at(ms: Mapping[int, float], width: int) -> float:
    """The verify cost at `width` from costs measured at some widths: exact where measured,
    linear between the measured widths around it, along the last two beyond the widest."""
    if width in ms:
        return float(ms[width])
    known = sorted(ms)
    below = [w for w in known if w < width]
    above = [w for w in known if w > width]
    if below and above:
        lo, hi = below[-1], above[0]
    elif len(below) >= 2:
        lo, hi = below[-2], below[-1]
    else:
        return float(ms[known[0]]) if known else 0.0
    return float(ms[lo]) + (float(ms[hi]) - float(ms[lo])) * (width - lo) / (hi - lo)


def table_cost(table: Mapping[int, Mapping[int, float]]) -> Callable[[int, int], float]:
    """cost(rows, width) from measured ms {rows: {width: ms}}: interpolated in width for each
    measured row count, then in rows, both as verify_at (linear between measured
    points, along the last two beyond the largest, the smallest's below it)."""

    def cost(rows: int, width: int) -> float:
        return verify_at({b: verify_at(ms, width) for b, ms in table.items()}, rows)

    return cost


def width_costs(profile: Mapping | None) -> Callable[[int, int], float] | None:
    """The cost(rows, width) of a stored profile's verify tables, or None without one."""
    if not profile or not isinstance(profile.get("batch_verify"), Mapping):
        return None
    try:
        table = {
            int(b): {int(w): float(ms) for w, ms in row.items()}
            for b, row in profile["batch_verify"]["ms"].items()
        }
        single = profile.get("verify", {}).get("ms", {})
        if single and 1 not in table:
            table[1] = {int(w): float(ms) for w, ms in single.items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a profile is an optimisation, never a failure
    return table_cost(table) if table else None


def context_costs(profile: Mapping | None) -> Callable[[int, int], float] | None:
    """One sequence's verify cost(context, width) from a stored profile's costs at its short
    and long contexts (interpolated as table_cost), or None without both. The long context is
    timed at the drafter's widths only: wider ones (lookup rounds) scale its widest by the
    short context's shape. Each table is made non-decreasing in width (x86 OpenBLAS times an
    odd width above the even one after it), so no width looks cheaper than a narrower one."""
    try:
        near = (profile.get("lookup") or {}).get("verify_ms") or profile["verify"]["ms"]
        near = {int(w): float(ms) for w, ms in near.items()}
        far = {int(w): float(ms) for w, ms in profile["long_context"]["verify_ms"].items()}
        contexts = int(profile["verify"]["context"]), int(profile["long_context"]["context"])
        top = max(far)
        far.update({w: far[top] * ms / near[top] for w, ms in near.items() if w > top})
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        return None  # no profile, or one made before long contexts were measured
    table = dict(zip(contexts, (_rising(near), _rising(far))))
    return table_cost(table) if len(table) == 2 else None


def _rising(ms: Mapping[int, float]) -> dict[int, float]:
    """`ms` by width, each at least the cost of every narrower width."""
    out, most = {}, 0.0
    for w in sorted(ms):
        most = out[w] = max(most, ms[w])
    return out
