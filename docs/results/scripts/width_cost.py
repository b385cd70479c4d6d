"""x @ W.T for each SmolLM2-135M weight shape at 1-8 rows, and the sum over one forward
(docs/results/smollm2-width-cost-xeon.json). Run with DFLASH2_BLAS_THREADS=1 on a quiet machine."""

import statistics
import time

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)
import mlx.core as mx

SHAPES = {"q/o": (576, 576), "k/v": (192, 576), "gate/up": (1536, 576), "down": (576, 1536)}
PER_FORWARD = {"q/o": 60, "k/v": 60, "gate/up": 60, "down": 30, "head": 1}  # 30 layers
ROWS = (1, 2, 3, 4, 8)


def median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    total = {m: 0.0 for m in ROWS}
    for name, (n, k) in {**SHAPES, "head": (49152, 576)}.items():
        w = mx.random.normal((n, k))
        mx.eval(w)
        row = []
        for m in ROWS:
            x = mx.random.normal((1, m, k))
            mx.eval(x)
            us = median_us(lambda: x @ w.T, 20 if name == "head" else 60)
            total[m] += us * PER_FORWARD[name]
            row.append(f"{m}: {us:.0f}")
        print(f"{name:8s} µs by rows  " + "  ".join(row), flush=True)
    print("matmuls of one forward, ms:", {m: round(v / 1000, 1) for m, v in total.items()})


if __name__ == "__main__":
    main()
