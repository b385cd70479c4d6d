"""The BLAS shim (`cblas_shim.c`): compiled once into the user cache, checked before it loads.

A shim cut short or zeroed (a copy or restore interrupted outside dflash2, a crash before the
disk had it) crashed every command (SIGBUS, SIGSEGV) when loaded, and another library in its
place left MLX on the slow reference BLAS for good. So a built shim is named after the hash of
its own bytes and loads only while they still match it; else it is built again. A full disk
never leaves a lesser build behind (the forward-only fallback is for compilers without the
kernel's intrinsics). MLX-free: _blas loads it first.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from .paths import cache_root

SHIM_SOURCE = Path(__file__).with_name("cblas_shim.c")


def shim() -> Path:
    """The compiled shim whose bytes match its name, built where there is none; an error
    where it cannot be built."""
    source = SHIM_SOURCE.read_text()
    key = hashlib.sha256((source + platform.machine()).encode()).hexdigest()[:16]
    folder = cache_root() / "blas"
    try:
        return _found(folder, key) or _build(folder, key, source)
    except OSError:  # a read-only (or full) cache: a private folder of this user's instead
        folder = _private_folder()
        return _found(folder, key) or _build(folder, key, source)


def open_shim() -> tuple[ctypes.CDLL, str]:
    """The shim loaded privately, and its path."""
    path = shim()
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    if not hasattr(lib, "dflash2_cblas_init"):
        raise OSError(f"{path} is not the BLAS shim (no dflash2_cblas_init)")
    return lib, str(path)


def _found(folder: Path, key: str) -> Path | None:
    """A shim of `key` in `folder` whose bytes still hash to its name; those that do not
    (damaged) are deleted."""
    found = []
    for path in folder.glob(f"cblas_shim_{key}_*.so"):
        try:
            before = path.stat()
            if _digest(path.read_bytes()) == path.stem.rsplit("_", 1)[1]:
                found.append((before.st_size, path))
            elif path.stat().st_ino == before.st_ino:  # not one just built again in its place
                path.unlink()
        except OSError:  # unreadable, or gone meanwhile: another may do
            continue
    return max(found)[1] if found else None  # the largest: the full build, where two are


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _private_folder() -> Path:
    """A temporary folder only this user can write (a shim is code: never one another user
    could have placed), made once and reused by later processes."""
    folder = Path(tempfile.gettempdir()) / f"dflash2-blas-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022 or folder.is_symlink():
        return Path(tempfile.mkdtemp(prefix="dflash2-blas-"))  # someone else's: a fresh one
    return folder


def _build(folder: Path, key: str, source: str) -> Path:
    """Compile the shim into `folder`, named after its key and its bytes' hash; an OSError
    where the folder cannot be written (or has no room)."""
    folder.mkdir(parents=True, exist_ok=True)
    # a work folder of its own (builds at once never share one) and the same file names in
    # each, so that one compiler's builds are the same bytes: the same name
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    src, tmp = work / "cblas_shim.c", work / "cblas_shim.so"
    try:
        src.write_text(source)
        cmd = [*_compiler(), "-O3", "-pthread", "-shared", "-fPIC", str(src), "-o", str(tmp)]
        # -O3 unrolls the kernel's loops, which keeps its sums in registers
        try:
            _run(cmd)
        except subprocess.CalledProcessError as exc:
            if _out_of_space(exc):
                raise OSError(errno.ENOSPC, "no space left to build the BLAS shim") from None
            cmd.append("-DDFLASH2_FORWARD_ONLY")  # a compiler without the kernel's intrinsics
            _run(cmd)
        with open(tmp, "rb") as f:
            data = f.read()
            os.fsync(f.fileno())  # on disk before its name says it is whole
        path = folder / f"cblas_shim_{key}_{_digest(data)}.so"
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # the unhashed name of earlier versions: unused
            (folder / f"cblas_shim_{key}.so").unlink(missing_ok=True)
        return path
    except subprocess.SubprocessError as exc:
        raise RuntimeError(
            f"could not compile the BLAS shim ({exc}); install a C compiler "
            "(apt install gcc) or name one in CC"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(cmd: list[str]) -> None:
    try:  # in English: its messages are read (_out_of_space)
        env = {**os.environ, "LC_ALL": "C"}
        subprocess.run(cmd, check=True, capture_output=True, timeout=120, env=env)
    except FileNotFoundError:  # no such compiler (not an unwritable folder)
        raise subprocess.SubprocessError(f"{cmd[0]}: command not found") from None


def _compiler() -> list[str]:
    """$CC whole (a wrapper: "ccache gcc"); else Python's own CC without its build flags."""
    given = os.environ.get("CC")
    try:
        return shlex.split(given) if given else (sysconfig.get_config_var("CC") or "cc").split()[:1]
    except ValueError as exc:  # an unclosed quote
        raise RuntimeError(f"CC={given!r} is not a command line: {exc}") from None


def _out_of_space(exc: subprocess.CalledProcessError) -> bool:
    """The build failed for want of room (a full disk, a file-size limit), not intrinsics."""
    said = ((exc.stderr or b"") + (exc.stdout or b"")).lower()
    return any(w in said for w in (b"no space left", b"file too large", b"file size limit"))
