"""The batched engine's verify cost over (rows, width), from a stored autotune profile.

The autotuner measures one verify forward over B rows of width W (costs.batch_verify_costs,
beside costs.verify_costs for one row) and stores the table in the profile ("batch_verify").
`width_costs` turns a profile into the cost(rows, width) of engine/width.py's width rule
(None when the profile has no table: the rule's default cost model applies).
"""

from __future__ import annotations

from typing import Callable, Mapping

from .autotune import verify_at


def table_cost(table: Mapping[int, Mapping[int, float]]) -> Callable[[int, int], float]:
    """cost(rows, width) from measured ms {rows: {width: ms}}: interpolated in width for each
    measured row count, then in rows, both as autotune.verify_at (linear between measured
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


def profile_width_costs(
    pair, target: str, drafter: str, *, root=None
) -> Callable[[int, int], float] | None:
    """The stored profile's cost(rows, width) for this pair on this machine, or None."""
    from .profiles import load_profile, profile_key

    try:
        return width_costs(load_profile(profile_key(pair, target, drafter), root))
    except Exception:  # noqa: BLE001 - a profile is an optimisation, never a failure
        return None
