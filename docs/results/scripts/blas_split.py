"""A forward's products at more rows than the few-row kernel's old cap: OpenBLAS's gemm whole
on one thread (what MLX got before), OpenBLAS in the shim's chunks over its pool of 2 threads
(split_threads) and the kernel over 2 threads; C = A @ W.T per SmolLM2-135M weight shape,
weighted by how often a forward runs it (30 layers), ms a forward; the three interleaved, 5
rounds, the quickest each (docs/results/smollm2-blas-split.json). Needs 2 free cores.

    python docs/results/scripts/blas_split.py OUT.json
"""

import ctypes
import json
import sys
import time

import numpy as np

import dflash2_mlx  # noqa: F401  (binds the BLAS and builds the shim)
from dflash2_mlx import _blas, _blas_shim
from dflash2_mlx.bench_env import environment

# (rows of W, k): times a forward runs it
SHAPES = {(576, 576): 60, (192, 576): 60, (1536, 576): 60, (576, 1536): 30, (49152, 576): 1}
ROWS = (16, 24, 32, 48, 64, 96, 128, 256, 512)
PTR = ctypes.POINTER(ctypes.c_float)


def main(out: str) -> None:
    info = _blas.info()
    level = {"avx2": 1, "avx512": 2}[info.kernel]
    shim = ctypes.CDLL(str(_blas_shim.shim()))
    lib = ctypes.CDLL(info.library)
    gemm = getattr(lib, f"{'scipy_' if info.route == 'scipy-openblas' else ''}cblas_sgemm")

    def whole(a, w, c):
        m, k = a.shape
        n = w.shape[0]
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        gemm(101, 111, 112, m, n, k, one, _p(a), k, _p(w), k, zero, _p(c), n)

    def split(a, w, c):
        m, n, k, pa, lda, pw, ldw, pc, ldc = _args(a, w, c)
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        done = shim.dflash2_split_sgemm(2, 111, 112, m, n, k, one, pa, lda, pw, ldw, zero, pc, ldc)
        assert done == 0, done

    def kernel(a, w, c):
        shim.dflash2_skinny_sgemm(level, 2, *_args(a, w, c))

    ways = {
        "openblas_1_thread": whole,
        "openblas_split_2_threads": split,
        "kernel_2_threads": kernel,
    }
    rng = np.random.default_rng(0)
    data = {}
    for m in ROWS:
        data[m] = []
        for (n, k), count in SHAPES.items():
            a = rng.standard_normal((m, k), dtype=np.float32)
            w = rng.standard_normal((n, k), dtype=np.float32)
            data[m].append((a, w, np.empty((m, n), np.float32), count))
    times = {m: {name: [] for name in ways} for m in ROWS}
    for _ in range(5):
        for m in ROWS:
            for name, fn in ways.items():
                total = 0.0
                for a, w, c, count in data[m]:
                    fn(a, w, c)
                    start = time.perf_counter()
                    fn(a, w, c)
                    total += count * (time.perf_counter() - start)
                times[m][name].append(1000 * total)
    result = {
        "what": __doc__.split("\n\n")[0],
        "command": "python docs/results/scripts/blas_split.py " + out,
        "environment": environment(),
        "ms_a_forward": {
            str(m): {k: round(min(v), 1) for k, v in t.items()} for m, t in times.items()
        },
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for m, t in result["ms_a_forward"].items():
        print(m, t)


def _p(x):
    return x.ctypes.data_as(PTR)


def _args(a, w, c):
    m, k = a.shape
    n = w.shape[0]
    return m, n, k, _p(a), k, _p(w), k, _p(c), n


if __name__ == "__main__":
    main(sys.argv[1])
