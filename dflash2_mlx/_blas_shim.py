"""The BLAS shim (`cblas_shim.c`): compiled once into the user cache, checked before it loads.

A shim cut short (a copy or restore interrupted outside dflash2) crashed every command with
SIGBUS when loaded, and one that would not load left MLX on the slow reference BLAS for good:
a damaged one is built again. A full disk never leaves a lesser build behind (the forward-only
fallback is for compilers without the kernel's intrinsics). MLX-free: _blas loads it first.
"""

from __future__ import annotations

import _ctypes
import ctypes
import errno
import hashlib
import os
import platform
import shlex
import struct
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from .paths import cache_root

SHIM_SOURCE = Path(__file__).with_name("cblas_shim.c")


def shim(rebuild: bool = False) -> Path:
    """The compiled shim, built where it is missing or damaged (`rebuild`: in any case); an
    error where it cannot be built."""
    source = SHIM_SOURCE.read_text()
    key = hashlib.sha256((source + platform.machine()).encode()).hexdigest()[:16]
    path = cache_root() / "blas" / f"cblas_shim_{key}.so"
    if rebuild or not _whole_library(path):
        try:
            _build(path, source)
        except OSError:  # a read-only cache: a private folder of this user's instead
            path = _private_folder() / path.name
            if rebuild or not _whole_library(path):
                _build(path, source)
    return path


def open_shim() -> tuple[ctypes.CDLL, str]:
    """The shim loaded privately, and its path; one that does not load as the shim (damaged,
    another library in its place) is built again once."""
    try:
        return _opened(shim())
    except (OSError, AttributeError):
        path = shim(rebuild=True)
    try:
        return _opened(path)
    except (OSError, AttributeError) as exc:
        raise OSError(f"the BLAS shim {path} does not load: {exc}") from None


def _opened(path: Path) -> tuple[ctypes.CDLL, str]:
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    if not hasattr(lib, "dflash2_cblas_init"):  # another library in its place: closed, else
        _ctypes.dlclose(lib._handle)  # the loader would hand it back for the rebuilt file
        raise AttributeError(f"{path} is not the shim (no dflash2_cblas_init)")
    return lib, str(path)


def _whole_library(path: Path) -> bool:
    """False where `path` is missing, empty or an ELF file shorter than its own header says
    (cut short: its loader would map pages past the end, and the process dies of SIGBUS)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    if size == 0:
        return False
    if head[:4] != b"\x7fELF" or head[4] != 2:  # not a 64-bit ELF: its loader says (OSError)
        return True
    order = "<" if head[5] == 1 else ">"
    if len(head) < 64:
        return False
    (program_at,) = struct.unpack_from(order + "Q", head, 0x20)
    (sections_at,) = struct.unpack_from(order + "Q", head, 0x28)
    program_size, programs, section_size, sections = struct.unpack_from(order + "HHHH", head, 0x36)
    ends = (program_at + program_size * programs, sections_at + section_size * sections)
    return max(ends) <= size


def _private_folder() -> Path:
    """A temporary folder only this user can write (a shim is code: never one another user
    could have placed), made once and reused by later processes."""
    folder = Path(tempfile.gettempdir()) / f"dflash2-blas-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022 or folder.is_symlink():
        return Path(tempfile.mkdtemp(prefix="dflash2-blas-"))  # someone else's: a fresh one
    return folder


def _build(path: Path, source: str) -> None:
    """Compile the shim into `path` (an OSError where its folder cannot be written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(f".{os.getpid()}.c")  # processes building at once never share one
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        src.write_text(source)
        cmd = [*_compiler(), "-O3", "-pthread", "-shared", "-fPIC", str(src), "-o", str(tmp)]
        # -O3 unrolls the kernel's loops, which keeps its sums in registers
        try:
            _run(cmd)
        except subprocess.CalledProcessError as exc:
            if _out_of_space(path, exc):
                raise OSError(errno.ENOSPC, "no space left to build the BLAS shim") from None
            cmd.append("-DDFLASH2_FORWARD_ONLY")  # a compiler without the kernel's intrinsics
            _run(cmd)
        os.replace(tmp, path)
    except subprocess.SubprocessError as exc:
        raise RuntimeError(
            f"could not compile the BLAS shim ({exc}); install a C compiler "
            "(apt install gcc) or name one in CC"
        ) from None
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


def _run(cmd: list[str]) -> None:
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    except FileNotFoundError:  # no such compiler (not an unwritable folder)
        raise subprocess.SubprocessError(f"{cmd[0]}: command not found") from None


def _compiler() -> list[str]:
    """$CC whole (a wrapper: "ccache gcc"); else Python's own CC without its build flags."""
    given = os.environ.get("CC")
    try:
        return shlex.split(given) if given else (sysconfig.get_config_var("CC") or "cc").split()[:1]
    except ValueError as exc:  # an unclosed quote
        raise RuntimeError(f"CC={given!r} is not a command line: {exc}") from None


def _out_of_space(path: Path, exc: subprocess.CalledProcessError) -> bool:
    """The build failed for want of room (a full disk, a file-size limit), not intrinsics."""
    said = ((exc.stderr or b"") + (exc.stdout or b"")).lower()
    if any(w in said for w in (b"no space left", b"file too large", b"file size limit")):
        return True
    try:
        return os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize < 1 << 20
    except OSError:
        return False
