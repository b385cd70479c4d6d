"""The BLAS shim's few-row kernel over 1 and 2 threads vs OpenBLAS's gemm at 1 and 2 threads:
C = A @ W.T per SmolLM2-135M weight shape at 1-24 rows, weights cold (copies filling ~300 MB
taken in turn, as a forward reads them), one call at a time through ctypes
(docs/results/smollm2-blas-kernel-threads.json). Needs 2 free cores; run on a quiet machine.

    python docs/results/scripts/kernel_threads.py OUT.json
"""

import ctypes
import json
import platform
import statistics
import sys
import time

import numpy as np

import dflash2_mlx  # noqa: F401  (binds the BLAS and builds the shim)
from dflash2_mlx import _blas, _blas_shim

SHAPES = {"q/o": (576, 576), "k/v": (192, 576), "gate/up": (1536, 576), "down": (576, 1536)}
SHAPES["head"] = (49152, 576)
ROWS = (1, 4, 8, 16, 24)
PTR = ctypes.POINTER(ctypes.c_float)


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")


def main(out: str) -> None:
    info = _blas.info()
    level = {"avx2": 1, "avx512": 2}[info.kernel]
    shim = ctypes.CDLL(str(_blas_shim.shim()))
    lib = ctypes.CDLL(info.library)
    prefix = "scipy_" if info.route == "scipy-openblas" else ""
    gemm = getattr(lib, f"{prefix}cblas_sgemm")
    gemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, PTR, ctypes.c_int, PTR, ctypes.c_int]
    gemm.argtypes += [ctypes.c_float, PTR, ctypes.c_int]
    set_threads = getattr(lib, f"{prefix}openblas_set_num_threads")
    rng = np.random.default_rng(0)
    results = []
    for name, (n, k) in SHAPES.items():
        copies = max(3, int(300e6 / (4 * n * k)))
        weights = [rng.standard_normal((n, k), dtype=np.float32) for _ in range(copies)]
        for m in ROWS:
            a = rng.standard_normal((m, k), dtype=np.float32)
            c = np.empty((m, n), np.float32)
            reps = max(3 * copies, 30)

            def timed(call) -> float:
                times = []
                for r in range(reps):
                    w = weights[r % copies]
                    t0 = time.perf_counter()
                    call(w)
                    times.append(time.perf_counter() - t0)
                return statistics.median(times) * 1e6

            def kernel(threads):
                return lambda w: shim.dflash2_skinny_sgemm(
                    level, threads, m, n, k, a.ctypes.data_as(PTR), k,
                    w.ctypes.data_as(PTR), k, c.ctypes.data_as(PTR), n,
                )  # fmt: skip

            def openblas(w):
                gemm(101, 111, 112, m, n, k, 1.0, a.ctypes.data_as(PTR), k,
                     w.ctypes.data_as(PTR), k, 0.0, c.ctypes.data_as(PTR), n)  # fmt: skip

            row = {"shape": name, "n": n, "k": k, "rows": m}
            for threads in (1, 2):
                set_threads(threads)
                row[f"openblas_{threads}t_us"] = round(timed(openblas), 1)
                row[f"kernel_{threads}t_us"] = round(timed(kernel(threads)), 1)
            row["kernel_2t_vs_1t"] = round(row["kernel_1t_us"] / row["kernel_2t_us"], 2)
            row["kernel_2t_vs_openblas_2t"] = round(row["openblas_2t_us"] / row["kernel_2t_us"], 2)
            results.append(row)
            print(json.dumps(row), flush=True)
    doc = {
        "what": __doc__.split("\n\n")[0],
        "command": "python docs/results/scripts/kernel_threads.py " + out,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpu": _cpu(), "arch": platform.machine(), **info.fields()},
        "results": results,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
