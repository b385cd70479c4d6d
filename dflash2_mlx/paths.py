"""Where dflash2 keeps its files: one cache root for the converted embedded model, downloads,
autotune profiles and the BLAS shim. MLX-free: _blas reads it before MLX loads."""

from __future__ import annotations

import os
import stat
import sys
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
    try:
        info = path.stat()  # through links: /dev/stdout is the pipe or file it leads to
    except FileNotFoundError:
        info = None
    if _written_as_it_is(path, info, text):
        return path
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
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


_STDOUT = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
_STDERR = ("/dev/stderr", "/dev/fd/2", "/proc/self/fd/2")


def _written_as_it_is(path: Path, info: os.stat_result | None, text: str) -> bool:
    """True where `path` is no file to replace, and `text` went to it: the process's own
    stdout or stderr (written at their offset: a file the shell opened for them is kept), a
    pipe, a FIFO or a device (appended to)."""
    name = os.path.abspath(path)
    stream = sys.stdout if name in _STDOUT else sys.stderr if name in _STDERR else None
    if stream is not None:
        stream.write(text)
        stream.flush()
        return True
    special = Path(name).parts[1:2] in (("dev",), ("proc",))
    if not special and (info is None or stat.S_ISREG(info.st_mode)):
        return False
    with open(path, "a") as fh:
        fh.write(text)
    return True
