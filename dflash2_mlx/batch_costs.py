"""The target's verify cost over (rows, width), for the batched engine's width cap.

`batch_verify_costs` times one verify forward over B rows of width W each, as the batched
engine runs it (one batch cache, every row at its own context depth), beside
bench.verify_costs (B = 1, the single-sequence forward a lone row runs). The autotuner stores
the table in the profile ("batch_verify"); `width_costs` turns a profile into the cost
function of engine/width.py (None when the profile has no table: the default rule applies).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping

import mlx.core as mx

from .bench import _median_ms, context_ids, verify_costs
from .engine.width import table_cost
from .target import batch as tbatch

# Row counts and widths the autotuner measures (widths also cut to what the pair can verify).
BATCHES = (2, 4)
WIDTHS = (1, 2, 4, 8, 12, 16)


def batch_verify_costs(
    pair,
    batches: Iterable[int],
    widths: Iterable[int],
    *,
    context: int = 256,
    repeats: int = 3,
    warmup: int = 1,
) -> dict:
    """Median ms of one verify forward of B rows x W tokens ({B: {W: ms}}), timed as in
    bench.verify_costs (forward, argmax read back, cache evaluated; a dependent chain) on a
    batch cache whose rows hold `context` tokens, less a few for each later row (ragged, as in
    the engine). Row count 1 is bench.verify_costs itself. Each call is rolled back after
    timing (outside it), so every call sees the same depths."""
    adapter = pair.decoder.target
    widths = sorted({int(w) for w in widths})
    table: dict[int, dict[int, float]] = {}
    for rows in sorted({int(b) for b in batches}):
        if rows == 1:
            table[1] = verify_costs(pair, widths, context=context, repeats=repeats)["ms"]
            continue
        singles = []
        for r in range(rows):
            cache = adapter.make_cache()
            ctx = context_ids(adapter.vocab_size, max(context - 3 * r, 1))
            adapter.prefill(mx.array([ctx]), cache, pair.decoder.prefill_chunk, 1)
            singles.append(cache)
        cache = tbatch.merge(singles)
        ordered = tbatch.keeps_column_order(adapter)
        samples: dict[int, list[float]] = {w: [] for w in widths}
        token = 1
        for rep in range(warmup + repeats):
            for w in widths[rep % len(widths) :] + widths[: rep % len(widths)]:
                ids = mx.array([[(token + 17 * j + r) % adapter.vocab_size for j in range(w)]
                                for r in range(rows)])
                t0 = time.perf_counter()
                fwd = adapter.forward(ids, cache)
                nxt = mx.argmax(fwd.logits[:, -1], axis=-1).tolist()
                mx.eval(fwd.features, [c.state for c in cache])
                dt = time.perf_counter() - t0
                tbatch.rollback(cache, fwd, [1] * rows, w, ordered)
                for c in cache:
                    if c.is_trimmable():
                        c.trim(1)
                token = int(nxt[0])
                if rep >= warmup:
                    samples[w].append(dt)
        table[rows] = {w: _median_ms(samples[w]) for w in widths}
    return {"context": context, "repeats": repeats, "ms": table}


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
