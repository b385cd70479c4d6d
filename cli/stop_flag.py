"""Ctrl-C during an answer: the first press stops the answer (the session is kept), a
second raises KeyboardInterrupt."""

from __future__ import annotations

import signal
from contextlib import contextmanager


class StopFlag:
    """SIGINT sets a flag (first press) or raises KeyboardInterrupt (second press)."""

    def __init__(self):
        self.set = False

    def _handler(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True

    def __enter__(self):
        self.old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.old)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as Ctrl-C is, so one handler saves the work of all."""

    def __init__(self, signum: int):
        super().__init__()
        self.signum = signum


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


def interrupt_status(e: KeyboardInterrupt) -> int:
    """The exit status a shell and a scheduler read: 128 + the signal's number."""
    return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)


@contextmanager
def terminate_as_interrupt():
    """Inside: SIGTERM (`kill`, a scheduler) and SIGHUP (the terminal or ssh session gone)
    stop the command as Ctrl-C does; an ignored one (nohup) stays ignored."""
    wanted = [getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    wanted = [s for s in wanted if signal.getsignal(s) is not signal.SIG_IGN]
    before = {s: signal.signal(s, _raise_terminated) for s in wanted}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
