"""Target forward costs on the embedded pair: median ms of 7 forwards of rows x width tokens
over ~250 tokens of context each (a batch cache, through the target adapter, rolled back after
each), and of N-token prefills (median of 3); prints one JSON line
(docs/results/smollm2-blas-split-engine-ab.json ran it under two commits' code, alternated).

    python docs/results/scripts/forward_costs.py
"""

import json
import time

import dflash2_mlx  # noqa: F401  (binds the BLAS before MLX loads)
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from dflash2_mlx import load_pair
from dflash2_mlx.target import batch as tbatch

CONTEXT = 250
SHAPES = ((1, 1), (1, 16), (4, 4), (4, 8), (8, 4), (2, 16), (8, 8))
PREFILLS = (64, 256, 1024)


def median_ms(fn, n: int = 7) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(sorted(times)[n // 2] * 1000, 1)


def main() -> None:
    pair = load_pair("smollm2-135m", offline=True)
    adapter, model = pair.decoder.target, pair.model

    def batched(rows: int, width: int) -> float:
        caches = []
        for r in range(rows):
            cache = make_prompt_cache(model)
            ids = list(range(100 + r, 100 + r + CONTEXT - 3 * r))
            mx.eval(model(mx.array([ids]), cache=cache))
            caches.append(cache)
        batch = tbatch.merge(caches)
        ids = mx.array([list(range(5, 5 + width))] * rows)

        def forward():
            mx.eval(adapter.forward(ids, batch.layers).logits)
            for c in batch.layers:
                c.trim(width)

        return median_ms(forward)

    def prefill(n: int) -> float:
        def run():
            mx.eval(model(mx.array([list(range(100, 100 + n))]), cache=make_prompt_cache(model)))

        return median_ms(run, 3)

    out = {f"{r}x{w}": batched(r, w) for r, w in SHAPES}
    out.update({f"prefill{n}": prefill(n) for n in PREFILLS})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
