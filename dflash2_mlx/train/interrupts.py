"""Training steps whole: Ctrl-C (or SIGTERM / SIGHUP, which the CLI turns into it) during a
step waits for the step's end, so the checkpoint an interrupt saves holds a whole step — its
weights, optimizer state and the sampler's draws alike — and a resumed run gives the same
drafter."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def whole_step() -> Iterator[None]:
    """Inside: SIGINT, SIGTERM and SIGHUP are noted, not acted on; leaving, a noted one goes
    to the handler it would have met (Python's: KeyboardInterrupt; the CLI's SIGTERM and
    SIGHUP: the same). An ignored signal stays ignored; off the main thread (no handlers
    there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    caught = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    wanted = [s for s in caught if signal.getsignal(s) is not signal.SIG_IGN]
    saved = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in wanted}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    if noted:
        signal.raise_signal(noted[0])
