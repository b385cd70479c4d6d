"""Why a verify's cost per extra token grows with the context on this CPU: the target's
attention (mx.fast.scaled_dot_product_attention, SmolLM2-135M's shapes: 9 query heads, 3 KV
heads, head_dim 64) at 4,096 context for 1, 4 and 8 query rows, split into its scores matmul,
softmax and probabilities-times-values matmul; and MLX's elementwise exp against NumPy's on the
same array (the softmax's exp is the part that costs). Medians of 40 runs, lower quartile too.

Usage: python cpu_attention_cost.py OUT.json"""

import json
import sys
import time

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)
import mlx.core as mx
from dflash2_mlx.bench_env import environment
import numpy as np


def ms(fn, runs: int = 40) -> dict:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    times.sort()
    return {"median": times[runs // 2], "q1": times[runs // 4]}


def main(out_path: str, context: int = 4096) -> None:
    k, v = mx.random.normal((1, 3, context, 64)), mx.random.normal((1, 3, context, 64))
    mx.eval(k, v)
    rows = {}
    for width in (1, 4, 8):
        q = mx.random.normal((1, 9, width, 64))
        grouped = (q * 0.125).reshape(1, 3, 3 * width, 64)
        scores = grouped @ k.swapaxes(-1, -2)
        probs = mx.softmax(scores, axis=-1, precise=True)
        mx.eval(q, grouped, scores, probs)
        mask = "causal" if width > 1 else None
        rows[width] = {
            "sdpa_ms": ms(
                lambda: mx.eval(
                    mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
                )
            ),
            "scores_matmul_ms": ms(lambda: mx.eval(grouped @ k.swapaxes(-1, -2))),
            "softmax_ms": ms(lambda: mx.eval(mx.softmax(scores, axis=-1, precise=True))),
            "probs_values_matmul_ms": ms(lambda: mx.eval(probs @ v)),
        }
        print(width, json.dumps(rows[width]), flush=True)
    x = mx.random.normal((1, 3, 24, context))
    mx.eval(x)
    a = np.array(x)
    elementwise = {
        "elements": x.size,
        "mlx_exp_ms": ms(lambda: mx.eval(mx.exp(x))),
        "mlx_log_ms": ms(lambda: mx.eval(mx.log(mx.abs(x)))),
        "mlx_mul_add_ms": ms(lambda: mx.eval(x * 2.0 + 1.0)),
        "numpy_exp_ms": ms(lambda: np.exp(a)),
    }
    print(json.dumps(elementwise))
    machine = environment()
    with open(out_path, "w") as f:
        json.dump(
            {"machine": machine, "context": context, "by_width": rows, "elementwise": elementwise},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main(sys.argv[1])
