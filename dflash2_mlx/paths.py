"""Where dflash2 keeps its files: one cache root for the converted embedded model, downloads,
autotune profiles and the BLAS shim. MLX-free: _blas reads it before MLX loads."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The user cache folder of dflash2 (DFLASH2_HOME, else XDG cache)."""
    if os.environ.get("DFLASH2_HOME"):
        return Path(os.environ["DFLASH2_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dflash2"
