"""The chat's terminal: whether both ends are one, line editing, and reading a line.

Answers go to stdout; the prompt, hints and command replies go wherever the user sees them
(stderr when stdout is redirected), so `dflash2 chat > answers.txt` keeps a clean file.
"""

from __future__ import annotations

import codecs
import os
import signal
import sys
from contextlib import contextmanager
from typing import Iterator


def _codec(encoding: str | None) -> str:
    """Python's name of an encoding ("utf-8", "ascii", "latin-1"); "" when unknown."""
    try:
        return codecs.lookup(encoding or "utf-8").name
    except LookupError:
        return ""


def locale_streams() -> None:
    """A locale that cannot write every character (ASCII, Latin-1) shows "?" for the others
    instead of stopping a command with UnicodeEncodeError; where it is ASCII (LC_ALL=C with
    Python's UTF-8 coercion off), stdin is read as UTF-8, of which ASCII is a part. A stream
    closed at start (`>&-`: Python makes it None) writes to the null device instead, as a
    command's output then goes nowhere rather than crashing it (uvicorn's logs ask isatty())."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115
    for stream in (sys.stdout, sys.stderr):
        utf = _codec(getattr(stream, "encoding", None)).startswith("utf")
        raises = getattr(stream, "errors", None) in ("strict", "surrogateescape")
        if raises and not utf and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    if _codec(getattr(sys.stdin, "encoding", None)) == "ascii" and hasattr(
        sys.stdin, "reconfigure"
    ):
        sys.stdin.reconfigure(encoding="utf-8")


def argument_text(text: str) -> str:
    """A command-line argument as the UTF-8 text it holds in an ASCII locale, where Python
    gets its other bytes as lone surrogates (else as it is: invalid bytes stay surrogates)."""
    if _codec(sys.getfilesystemencoding()) != "ascii":
        return text
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeDecodeError:
        return text


def interactive() -> bool:
    """Both stdin and stdout are the terminal."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def line_editing() -> None:
    """GNU readline's line editing and history for input(), with bracketed paste: a pasted
    text of several lines is one message (CPython turns bracketed paste off for its REPL,
    which runs a paste line by line). libedit (some macOS builds) keeps its defaults, as
    does a dumb terminal (Emacs' shell: its escape codes would show as text)."""
    try:
        import readline
    except ImportError:  # pragma: no cover
        return
    if "libedit" not in (readline.__doc__ or "") and os.environ.get("TERM") != "dumb":
        readline.parse_and_bind("set enable-bracketed-paste on")


def read_line(prompt: str) -> str:
    """A line from stdin, `prompt` shown where the user sees it (stderr when stdout is
    redirected: input() would write it into the answers); a paste's last newlines dropped."""
    if sys.stdin.isatty() and not sys.stdout.isatty():
        sys.stderr.write(prompt)
        sys.stderr.flush()
        prompt = ""
    return input(prompt).rstrip("\r\n")


def _in_background(fd: int) -> bool:
    """The terminal's foreground is another process group (the shell's, after `&`)."""
    try:
        return os.tcgetpgrp(fd) != os.getpgrp()
    except OSError:  # not our controlling terminal: no job control to stop us
        return False


@contextmanager
def keys_unechoed() -> Iterator[None]:
    """While an answer streams, what the user types ahead is not echoed into it (the echo
    and its newline broke the live redraw); the line stays in the terminal's input buffer
    and the next prompt reads it. Ctrl-C still interrupts."""
    try:
        import termios
    except ImportError:  # pragma: no cover - no termios (Windows)
        yield
        return
    try:
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, termios.error):  # stdin is no terminal (a pipe, a file)
        yield
        return
    if _in_background(fd):  # a job put in the background (`&`): setting it would stop us
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, quiet)  # TCSANOW: keep what was typed
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


@contextmanager
def ends_on_hangup() -> Iterator[None]:
    """SIGTERM and SIGHUP (the terminal closed, `kill`) end the program through its exits,
    as Ctrl-C does: the terminal gets its cursor and echo back (the live view hides one,
    an answer turns the other off). Exit status 128 + the signal, as the shell reports."""

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    wanted = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    saved = {  # an ignored one (nohup's SIGHUP) stays ignored
        s: signal.signal(s, stop) for s in wanted if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def text_row(table, *cells, **row) -> None:
    """A table row whose strings are text, not Rich markup (a system prompt "[/INST]" or a
    category "[code]" shows as written)."""
    from rich.text import Text

    table.add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **row)


def utf8_problem(text: str) -> str | None:
    """What makes `text` not UTF-8 (None: it is): undecodable bytes reach Python as lone
    surrogates (a command line's always; stdin's with errors="surrogateescape")."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        byte = f" (byte 0x{code - 0xDC00:02x})" if 0xDC80 <= code <= 0xDCFF else ""
        return f"is not valid UTF-8{byte} at character {e.start}"
