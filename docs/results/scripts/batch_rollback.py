"""Per-row rollback after a batched verify (target/batch.py) on the embedded SmolLM2 target:
4 rows of a given context, a verify forward of width 5, rows keeping different amounts. Two
arms in one process, alternated: "refill" (the engine's: a row's rejected tail is refilled
with its oldest columns, O(width)) and "shift" (mlx-lm's `prepare(right_padding=)` +
`finalize()`: every row rolled right, O(context)). Times the rollback + evaluation of the
caches only (the forward is the same in both), median over the repeats -> JSON.
Usage: nice -n 10 python batch_rollback.py OUT.json [--contexts 200,1000,4000] [--repeats 12]"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import dflash2_mlx as d2  # binds the optimized BLAS before MLX loads
import mlx.core as mx

from dflash2_mlx import bench_env
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.target import batch as tbatch

ROWS, WIDTH = 4, 5
KEEPS = ([1, 3, 5, 2], [4, 1, 2, 5])


def shift_rollback(cache: tbatch.BatchCache, keeps: list[int]) -> None:
    """The O(context) way: trim to the longest keep, roll each shorter row right."""
    longest = max(keeps)
    for c in cache.attention:
        c.trim(WIDTH - longest)
        c.prepare(right_padding=[longest - k for k in keeps])
        c.finalize()


def batch_cache(adapter, context: int) -> tbatch.BatchCache:
    singles = []
    for r in range(ROWS):
        cache = adapter.make_cache()
        ids = [(7 * j + r) % (adapter.vocab_size - 10) + 5 for j in range(context + 5 * r)]
        adapter.prefill(mx.array([ids]), cache, 512, 1)
        singles.append(cache)
    return tbatch.merge(singles)


def time_arm(adapter, context: int, arm: str, repeats: int) -> list[float]:
    cache = batch_cache(adapter, context)
    out = []
    for it in range(repeats + 2):
        ids = mx.array([[(it * 13 + j + r) % 40000 + 5 for j in range(WIDTH)] for r in range(ROWS)])
        fwd = adapter.forward(ids, cache.layers)
        mx.eval(fwd.logits, [c.state for c in cache.layers])
        keeps = KEEPS[it % 2]
        t0 = time.perf_counter()
        if arm == "refill":
            tbatch.rollback(cache, fwd, keeps, WIDTH)
        else:
            shift_rollback(cache, keeps)
        mx.eval([c.state for c in cache.layers])
        if it >= 2:
            out.append((time.perf_counter() - t0) * 1000.0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--contexts", default="200,1000,4000")
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    adapter = pair.decoder.target
    results = {}
    for context in [int(c) for c in args.contexts.split(",")]:
        ms = {"refill": [], "shift": []}
        for arm in ("shift", "refill", "refill", "shift"):
            ms[arm] += time_arm(adapter, context, arm, args.repeats // 2)
        med = {arm: round(statistics.median(v), 2) for arm, v in ms.items()}
        med["shift/refill"] = round(med["shift"] / med["refill"], 2)
        results[str(context)] = med
        print(context, med, flush=True)
    env = bench_env.environment()
    res = {
        "what": f"Rollback + cache evaluation after a verify of {ROWS} rows x width {WIDTH} "
        "(rows keep different amounts), median ms: the engine's O(width) refill vs "
        "mlx-lm's O(context) right shift, by context length per row.",
        "command": "nice -n 10 python docs/results/scripts/batch_rollback.py "
        + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {k: env[k] for k in ("chip", "blas", "blas_threads", "mlx", "device")},
        "ms": results,
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
