"""Training steps whole: Ctrl-C (or SIGTERM, which the CLI turns into it) during a step waits
for the step's end, so the checkpoint an interrupt saves holds a whole step — its weights,
optimizer state and the sampler's draws alike — and a resumed run gives the same drafter."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def whole_step() -> Iterator[None]:
    """Inside: SIGINT and SIGTERM are noted, not acted on; leaving, a noted one raises
    KeyboardInterrupt. Off the main thread (no signal handlers there) signals go on as ever."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    wanted = (signal.SIGINT, signal.SIGTERM)
    saved = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in wanted}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    if noted:
        raise KeyboardInterrupt
