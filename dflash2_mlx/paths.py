"""Where dflash2 keeps its files: one cache root for the converted embedded model, downloads,
autotune profiles and the BLAS shim. MLX-free: _blas reads it before MLX loads."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def cache_root() -> Path:
    """The user cache folder of dflash2 (DFLASH2_HOME, else XDG cache)."""
    if os.environ.get("DFLASH2_HOME"):
        return Path(os.environ["DFLASH2_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dflash2"


def write_whole(path: str | Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all: into a new file beside it (two writers
    never share one), then renamed over it. A failure (a full disk) raises the OSError and
    leaves the file that was there as it was. A symlink is written through (its target is
    replaced); the file keeps its mode, a new one gets the umask's."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = path.stat()  # through links: /dev/stdout is the pipe it names
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):  # /dev/stdout, a pipe: as it is
        with open(path, "w") as fh:
            fh.write(text)
        return path
    mode = None if info is None else info.st_mode & 0o7777
    for attempt in range(100):
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{attempt}.tmp")
        try:  # 0o666: the kernel applies the umask, as to a plain write
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{target.parent}: no free name for a temporary file")
    try:
        with os.fdopen(fd, "w") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
