"""The server's log lines written by a thread of their own, never by the event loop.

A reader that stops reading (a terminal paused with Ctrl-S, `| less` left unscrolled, a stalled
log shipper) fills the pipe, and a write to a full pipe blocks: written from the event loop, it
froze every request, and signals could no longer stop the server. Lines wait in a bounded
queue instead; past it they are dropped and counted, and the count is logged once the reader
reads again. At exit the queue is written out for up to a second.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time

QUEUED_LINES = 10_000
EXIT_FLUSH_S = 1.0


class BackgroundStream:
    """A text stream for logging.StreamHandler that queues its writes for a writer thread
    (a daemon: one blocked on a full pipe never holds the process up)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lines: queue.Queue[str] = queue.Queue(QUEUED_LINES)
        self.dropped = 0
        threading.Thread(target=self._write_out, name="dflash2-log", daemon=True).start()
        atexit.register(self.drain, EXIT_FLUSH_S)

    def write(self, text: str) -> int:
        try:
            self.lines.put_nowait(text)
        except queue.Full:
            self.dropped += 1
        return len(text)

    def flush(self) -> None:  # written by the thread
        pass

    def drain(self, seconds: float) -> None:
        """Wait up to `seconds` for the queued lines to be written."""
        deadline = time.monotonic() + seconds
        while self.lines.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _write_out(self) -> None:
        while True:
            text = self.lines.get()
            if self.dropped:
                n, self.dropped = self.dropped, 0
                text = f"({n} log lines dropped: the log's reader did not keep up)\n" + text
            try:
                data = text.encode("utf-8", "replace")
                while data:
                    data = data[os.write(self.fd, data) :]
            except OSError:  # the reader is gone (a broken pipe): the lines go nowhere
                pass
            finally:
                self.lines.task_done()


_streams: dict[int, BackgroundStream] = {}


def drain_logs(seconds: float = EXIT_FLUSH_S) -> None:
    """Write out the queued lines, for up to `seconds` (before a signal ends the process,
    which runs no atexit hook)."""
    deadline = time.monotonic() + seconds
    for stream in list(_streams.values()):
        stream.drain(max(0.0, deadline - time.monotonic()))


def write_in_background(loggers: list[str]) -> None:
    """The stream handlers of `loggers` that write to a file descriptor (stderr, stdout)
    write through a BackgroundStream (one a descriptor)."""
    for name in loggers:
        for handler in logging.getLogger(name).handlers:
            if type(handler) is not logging.StreamHandler or isinstance(
                handler.stream, BackgroundStream
            ):
                continue
            try:
                fd = handler.stream.fileno()
            except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
                continue
            if fd not in _streams:
                _streams[fd] = BackgroundStream(fd)
            handler.setStream(_streams[fd])
