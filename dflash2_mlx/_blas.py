"""Bind MLX's BLAS to an optimized OpenBLAS on Linux, before `mlx.core` is imported.

The Linux `mlx-cpu` wheel links the single-threaded netlib reference BLAS, which makes every
fp32 matmul compute-bound and speculative decoding pointless. MLX resolves `cblas_sgemm`,
`cblas_dgemm` and `cblas_cgemm` dynamically, so a library loaded with RTLD_GLOBAL first wins.

Routes, in order: a system OpenBLAS (Debian `libopenblas0-pthread`), else the pip wheel
`scipy-openblas32` through a tiny C shim (its symbols carry a `scipy_` prefix) compiled once
into the user cache. `DFLASH2_BLAS=stock` opts out. No effect on macOS (Accelerate is used).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

from .paths import cache_root

_SHIM_SOURCE = r"""
/* Forward MLX's unprefixed CBLAS calls to scipy-openblas32's prefixed ones. */
extern void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                              const float *, int, float, float *, int);
extern void scipy_cblas_dgemm(int, int, int, int, int, int, double, const double *, int,
                              const double *, int, double, double *, int);
extern void scipy_cblas_cgemm(int, int, int, int, int, int, const void *, const void *, int,
                              const void *, int, const void *, void *, int);
void cblas_sgemm(int o, int ta, int tb, int m, int n, int k, float al, const float *a, int lda,
                 const float *b, int ldb, float be, float *c, int ldc) {
  scipy_cblas_sgemm(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
}
void cblas_dgemm(int o, int ta, int tb, int m, int n, int k, double al, const double *a, int lda,
                 const double *b, int ldb, double be, double *c, int ldc) {
  scipy_cblas_dgemm(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
}
void cblas_cgemm(int o, int ta, int tb, int m, int n, int k, const void *al, const void *a,
                 int lda, const void *b, int ldb, const void *be, void *c, int ldc) {
  scipy_cblas_cgemm(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
}
"""


@dataclass(frozen=True)
class BlasInfo:
    """What BLAS MLX's CPU matmuls use in this process."""

    route: str  # "accelerate" | "system-openblas" | "scipy-openblas" | "stock"
    library: str | None
    note: str = ""
    threads: int | None = None
    core: str | None = None  # the OpenBLAS kernel set in use (e.g. "SkylakeX", "Haswell")

    @property
    def optimized(self) -> bool:
        return self.route != "stock"


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


def _scipy_openblas_shim() -> str | None:
    try:
        import scipy_openblas32  # type: ignore
    except ImportError:
        return None
    lib_dir = Path(scipy_openblas32.get_lib_dir())
    libs = sorted(lib_dir.glob("libscipy_openblas*.so*"))
    if not libs:
        return None
    lib = libs[0]
    key = hashlib.sha256((_SHIM_SOURCE + str(lib) + platform.machine()).encode()).hexdigest()[:16]
    shim = cache_root() / "blas" / f"cblas_shim_{key}.so"
    if not shim.exists():
        try:
            _build_shim(shim, lib)
        except OSError:  # a read-only cache: a private folder of this user's instead
            shim = _private_folder() / shim.name
            if not shim.exists():
                _build_shim(shim, lib)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)  # the shim's dependency, loaded first
    return str(shim)


def _private_folder() -> Path:
    """A temporary folder only this user can write (a shim is code: never one another user
    could have placed), made once and reused by later processes."""
    folder = Path(tempfile.gettempdir()) / f"dflash2-blas-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022 or folder.is_symlink():
        return Path(tempfile.mkdtemp(prefix="dflash2-blas-"))  # someone else's: a fresh one
    return folder


def _build_shim(shim: Path, lib: Path) -> None:
    """Compile the shim into `shim` (an OSError where its folder cannot be written)."""
    shim.parent.mkdir(parents=True, exist_ok=True)
    src = shim.with_suffix(".c")
    src.write_text(_SHIM_SOURCE)
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    tmp = shim.with_suffix(f".{os.getpid()}.tmp")
    cmd = [
        *cc.split()[:1],
        "-O2",
        "-shared",
        "-fPIC",
        str(src),
        "-o",
        str(tmp),
        f"-L{lib.parent}",
        f"-l:{lib.name}",
        f"-Wl,-rpath,{lib.parent}",
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"could not compile the OpenBLAS shim ({' '.join(cmd)}): {exc}")
    os.replace(tmp, shim)


def _core_name(handle: ctypes.CDLL) -> str | None:
    """The kernel set OpenBLAS chose for this CPU (or OPENBLAS_CORETYPE), if it says."""
    for name in ("openblas_get_corename", "scipy_openblas_get_corename"):
        fn = getattr(handle, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            return (fn() or b"").decode() or None
    return None


def default_threads() -> int:
    """BLAS threads: DFLASH2_BLAS_THREADS, else half the cores (at least 1)."""
    env = os.environ.get("DFLASH2_BLAS_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    if env:
        warnings.warn(f"DFLASH2_BLAS_THREADS={env!r} is not a count >= 1; using the default")
    return max(1, (os.cpu_count() or 2) // 2)


def _set_threads() -> None:
    """OpenBLAS reads OPENBLAS_NUM_THREADS when it loads: DFLASH2_BLAS_THREADS, dflash2's
    own setting, wins over it; else one already set is kept; else the default."""
    if (
        os.environ.get("DFLASH2_BLAS_THREADS", "").strip()
        or not os.environ.get("OPENBLAS_NUM_THREADS", "").strip().isdigit()
    ):
        os.environ["OPENBLAS_NUM_THREADS"] = str(default_threads())


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
    if mode not in ("auto", "openblas"):
        warnings.warn(f"DFLASH2_BLAS={mode!r} is not one of auto, openblas, stock; using auto")
    late = "mlx.core" in sys.modules
    # OpenBLAS spin-waits its threads: with 2 threads on a 2-core machine that is also running
    # anything else, a decode step was measured 5x slower than with 1 thread.
    _set_threads()
    errors = []
    for route, find in (
        ("system-openblas", _system_openblas),
        ("scipy-openblas", _scipy_openblas_shim),
    ):
        try:
            path = find()
        except Exception as exc:  # noqa: BLE001 - report and try the next route
            errors.append(f"{route}: {exc}")
            continue
        if path is None:
            continue
        try:
            handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
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
        _INFO = BlasInfo(route, path, note, _threads_in_use(handle), _core_name(handle))
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
