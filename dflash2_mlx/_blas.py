"""Bind MLX's BLAS to an optimized OpenBLAS on Linux, before `mlx.core` is imported.

The Linux `mlx-cpu` wheel links the single-threaded netlib reference BLAS, which makes every
fp32 matmul compute-bound and speculative decoding pointless. MLX resolves `cblas_sgemm`,
`cblas_dgemm` and `cblas_cgemm` dynamically, so a library loaded with RTLD_GLOBAL first wins.

Routes, in order: a system OpenBLAS (Debian `libopenblas0-pthread`), else the pip wheel
`scipy-openblas32` (its symbols carry a `scipy_` prefix). Either is reached through a small C
shim (`cblas_shim.c`, compiled once into the user cache) that computes products of a few rows
itself, where OpenBLAS is slowest. `DFLASH2_BLAS=openblas` keeps OpenBLAS alone,
`DFLASH2_BLAS=stock` the reference BLAS, `DFLASH2_BLAS=avx2` caps the kernel at AVX2 (what a
Haswell or Zen 2/3 CPU runs, tested on an AVX-512 one). No effect on macOS (Accelerate).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from ._blas_shim import open_shim

# The shim's own kernel takes products of up to this many rows (a decode step, a verify of a
# few tokens, small batches), split over its own threads (kernel_threads). Measured on
# SmolLM2's weight shapes against OpenBLAS's gemm: at 1 thread 1.0-3.5x faster up to 24 rows
# and slower from about 32 (docs/results/smollm2-blas-kernel-ab.json); at 2 threads 1.0-3.3x
# faster but for one shape at 8 and 24 rows (0.8x, 0.97x: smollm2-blas-kernel-threads.json).
KERNEL_MAX_ROWS = 24
# Where OpenBLAS runs one thread and the kernel two or more, the products the kernel does not
# take go to OpenBLAS in chunks over the kernel's threads (the shim's split_threads: 1.8-1.95x
# OpenBLAS alone at 24-512 rows on 2 cores), and the kernel at 2 threads stays ahead of that to
# about 48 rows (45 vs 58 ms a SmolLM2 forward's products at 24, 84 vs 90 at 48, 106 vs 114 at
# 64 but slower than the chunks on some weight shapes there, behind from 96:
# docs/results/smollm2-blas-split.json).
KERNEL_MAX_ROWS_SPLIT = 48
_KERNEL_NAMES = {1: "avx2", 2: "avx512"}


@dataclass(frozen=True)
class BlasInfo:
    """What BLAS MLX's CPU matmuls use in this process."""

    route: str  # "accelerate" | "system-openblas" | "scipy-openblas" | "stock"
    library: str | None
    note: str = ""
    threads: int | None = None
    core: str | None = None  # the OpenBLAS kernel set in use (e.g. "SkylakeX", "Haswell")
    kernel: str | None = None  # the shim's few-row kernel ("avx512", "avx2"), if it runs
    kernel_rows: int = 0  # the most rows it takes (more go to OpenBLAS)
    kernel_threads: int = 0  # the threads it splits a product over
    split: bool = False  # products of more rows: OpenBLAS in chunks over the kernel's threads

    @property
    def optimized(self) -> bool:
        return self.route != "stock"

    def fields(self) -> dict:
        """What `doctor` and the benchmarks' JSON record."""
        return {
            "blas": self.route,
            "blas_library": self.library,
            "blas_threads": self.threads,
            "blas_core": self.core,
            "blas_kernel": self.kernel,
            "blas_kernel_rows": self.kernel_rows or None,
            "blas_kernel_threads": self.kernel_threads or None,
            "blas_split": self.split,
            "blas_note": self.note,
        }


_INFO: BlasInfo | None = None
_HANDLES: list[ctypes.CDLL] = []


def _system_openblas() -> str | None:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    found = [line.split("=>")[-1].strip() for line in out.splitlines() if "libopenblas" in line]
    # Prefer the pthread build: it exports the cblas_* names MLX wants.
    found.sort(key=lambda p: ("pthread" not in p, "openmp" in p, p))
    return found[0] if found else None


def _scipy_openblas() -> str | None:
    try:
        import scipy_openblas32  # type: ignore
    except ImportError:
        return None
    libs = sorted(Path(scipy_openblas32.get_lib_dir()).glob("libscipy_openblas*.so*"))
    return str(libs[0]) if libs else None


def _load(
    path: str, prefix: str, kernel: bool, asked: bool, most: int = 2
) -> tuple[ctypes.CDLL, str | None, int, int, bool]:
    """Load an OpenBLAS behind the shim; returns its handle, the shim's kernel in use, the
    most rows that kernel takes, its threads and whether larger products are split over them
    (`asked`: see kernel_threads; `most`: the highest kernel allowed, 2 AVX-512, 1 AVX2).

    The library is opened privately and its gemm entry points looked up, and the shim is
    initialised with them before it takes the global cblas_* names, so that no failure leaves
    MLX calling a shim with nothing to forward to; the library then joins the global scope
    after it (its LAPACK for MLX). A system OpenBLAS serves alone where no shim can be built."""
    handle = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    # an ILP64 build (names ending in 64_) fails here, with nothing bound yet
    gemms = [ctypes.cast(getattr(handle, f"{prefix}cblas_{t}gemm"), ctypes.c_void_p) for t in "sdc"]
    try:
        shim, shim_path = open_shim()
    except (OSError, RuntimeError):
        if prefix:  # scipy-openblas's names are prefixed: MLX cannot use it without the shim
            raise
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), None, 0, 0, False
    openblas_threads = _threads_in_use(handle) or 1
    threads = kernel_threads(openblas_threads, asked)
    split = int(kernel and openblas_threads == 1 and threads > 1)
    rows = (KERNEL_MAX_ROWS_SPLIT if split else KERNEL_MAX_ROWS) if kernel else 0
    level = shim.dflash2_cblas_init(*gemms, *map(ctypes.c_int, (rows, most, threads, split)))
    _HANDLES.append(ctypes.CDLL(shim_path, mode=ctypes.RTLD_GLOBAL))  # initialised: now global
    name = _KERNEL_NAMES.get(level)
    if not name:
        rows = threads = split = 0
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), name, rows, threads, bool(split)


def _core_name(handle: ctypes.CDLL) -> str | None:
    """The kernel set OpenBLAS chose for this CPU (or OPENBLAS_CORETYPE), if it says."""
    for name in ("openblas_get_corename", "scipy_openblas_get_corename"):
        fn = getattr(handle, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            return (fn() or b"").decode() or None
    return None


def _asked_threads() -> int | None:
    """DFLASH2_BLAS_THREADS as a count >= 1, else None (a value that is not one: warned)."""
    env = os.environ.get("DFLASH2_BLAS_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    if env:
        warnings.warn(f"DFLASH2_BLAS_THREADS={env!r} is not a count >= 1; using the default")
    return None


def kernel_threads(openblas_threads: int, asked: bool) -> int:
    """The kernel's threads: OpenBLAS's where DFLASH2_BLAS_THREADS `asked` for a count (not
    OPENBLAS_NUM_THREADS: dflash2 sets that one, and its child processes inherit it), else at
    least 2 where there are 2 cores. On 2 cores its second thread made plain decoding 1.17x and
    dflash2 1.29x faster on an idle machine, 1.11x and 0.96x with another process busy on a
    core, where OpenBLAS's own 2 threads (the prefill's: still half the cores) had slowed a
    decode step 5x (docs/results/smollm2-blas-kernel-threads.json)."""
    if asked:
        return openblas_threads
    return max(openblas_threads, min(2, len(os.sched_getaffinity(0))))


def _set_threads() -> bool:
    """OpenBLAS reads OPENBLAS_NUM_THREADS when it loads: DFLASH2_BLAS_THREADS, dflash2's
    own setting, wins over it; else one already set is kept; else the default. Returns whether
    DFLASH2_BLAS_THREADS sets a count."""
    asked = _asked_threads()
    given = os.environ.get("DFLASH2_BLAS_THREADS", "").strip()
    if given or not os.environ.get("OPENBLAS_NUM_THREADS", "").strip().isdigit():
        half = max(1, (os.cpu_count() or 2) // 2)  # the default: half the cores
        os.environ["OPENBLAS_NUM_THREADS"] = str(asked or half)
    return asked is not None


def _threads_in_use(handle: ctypes.CDLL) -> int | None:
    """The threads OpenBLAS runs (it caps what it was asked for at the cores it sees)."""
    for name in ("openblas_get_num_threads", "scipy_openblas_get_num_threads"):
        fn = getattr(handle, name, None)
        if fn is not None:
            fn.restype = ctypes.c_int
            n = fn()
            return n if n > 0 else None
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "")
    return int(threads) if threads.isdigit() else None


def bind(mode: str | None = None) -> BlasInfo:
    """Bind an optimized BLAS once per process; later calls return the first result."""
    global _INFO
    if _INFO is not None:
        return _INFO
    mode = (mode or os.environ.get("DFLASH2_BLAS", "auto")).strip().lower()
    if sys.platform == "darwin":
        _INFO = BlasInfo("accelerate", None)
        return _INFO
    if mode == "stock":
        _INFO = BlasInfo("stock", None, "DFLASH2_BLAS=stock: reference BLAS kept by request")
        return _INFO
    if mode not in ("auto", "openblas", "avx2"):
        warnings.warn(
            f"DFLASH2_BLAS={mode!r} is not one of auto, openblas, avx2, stock; using auto"
        )
        mode = "auto"
    late = "mlx.core" in sys.modules
    # OpenBLAS spin-waits its threads: with 2 threads on a 2-core machine that is also running
    # anything else, a decode step was measured 5x slower than with 1 thread.
    asked = _set_threads()
    errors = []
    for route, find, prefix in (
        ("system-openblas", _system_openblas, ""),
        ("scipy-openblas", _scipy_openblas, "scipy_"),
    ):
        try:
            path = find()
            if path is None:
                continue
            most = 1 if mode == "avx2" else 2
            handle, kernel, rows, kthreads, split = _load(
                path, prefix, mode != "openblas", asked, most
            )
        except Exception as exc:  # noqa: BLE001 - report and try the next route
            errors.append(f"{route}: {exc}")
            continue
        _HANDLES.append(handle)
        note = "bound after mlx.core was imported: may not take effect" if late else ""
        if late:  # MLX resolved its BLAS symbols already: matmuls stay on the slow reference
            warnings.warn(
                "dflash2: mlx.core was imported before dflash2_mlx, so the optimized BLAS "
                "may not take effect (matrix products several times slower): import "
                "dflash2_mlx first",
                stacklevel=3,
            )
        threads, core = _threads_in_use(handle), _core_name(handle)
        _INFO = BlasInfo(route, path, note, threads, core, kernel, rows, kthreads, split)
        return _INFO
    why = (
        "; ".join(errors)
        or "no OpenBLAS found (pip install scipy-openblas32, or apt install libopenblas0-pthread)"
    )
    warnings.warn(f"dflash2: using MLX's slow reference BLAS ({why})", stacklevel=2)
    _INFO = BlasInfo("stock", None, why)
    return _INFO


def info() -> BlasInfo:
    return bind()
