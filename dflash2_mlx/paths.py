"""Where dflash2 keeps its files: one cache root for the converted embedded model, downloads,
autotune profiles and the BLAS shim. MLX-free: _blas reads it before MLX loads."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """The user cache folder of dflash2 (DFLASH2_HOME, else XDG cache)."""
    if os.environ.get("DFLASH2_HOME"):
        return Path(os.environ["DFLASH2_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dflash2"


def write_whole(path: str | Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all: into a temporary file of its own beside it
    (two writers never share one), then renamed over it. A failure (a full disk) raises the
    OSError and leaves the file that was there as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), 0o666 & ~_umask())  # as a plain write's (mkstemp: 0600)
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
