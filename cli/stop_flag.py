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
    """SIGTERM, raised as Ctrl-C is, so one handler saves the work of both."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


def interrupt_status(e: KeyboardInterrupt) -> int:
    """The exit status a shell and a scheduler read: 128 + the signal's number."""
    return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)


@contextmanager
def terminate_as_interrupt():
    """Inside: SIGTERM (`kill`, a scheduler) stops the command as Ctrl-C does."""
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
