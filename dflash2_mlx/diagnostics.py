"""`dflash2 doctor`: what this install runs on (backend, device, BLAS, versions, profiles)."""

from __future__ import annotations

import platform
import sys
from typing import Any

import mlx.core as mx

from . import _blas, kernels, paths


def doctor() -> dict[str, Any]:
    """Backend, device, BLAS in use and versions."""
    import mlx_lm

    metal = bool(getattr(mx, "metal", None) and mx.metal.is_available())
    from ._version import __version__

    return {
        "dflash2": __version__,
        "platform": f"{platform.system()} {platform.machine()}",
        "python": sys.version.split()[0],
        "mlx": getattr(mx, "__version__", "?"),
        "mlx_lm": getattr(mlx_lm, "__version__", "?"),
        "device": str(mx.default_device()),
        "metal": metal,
        **_blas.info().fields(),
        "cache_dir": str(paths.cache_root()),
        "autotune": _profiles_line(),
        "kernels": kernels.describe(),
    }


def _profiles_line() -> str:
    """Where the autotune profiles are, and how to forget them."""
    from .profiles import profile_dir

    folder = profile_dir()
    n = len(list(folder.glob("*.json"))) if folder.is_dir() else 0
    if not n:
        return f"no profile yet in {folder} (dflash2 bench --autotune makes one)"
    return f"{n} profile{'s' if n != 1 else ''} in {folder} (deleting the folder forgets them)"
