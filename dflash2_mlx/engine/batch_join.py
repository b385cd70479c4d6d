"""Requests waiting to join a BatchDecoder's rows (engine/batch.py), and their prefills.

A request joins once its prefill is done. A step feeds the waiting prefills a budget of prompt
tokens in whole chunks: `prefill_step` while rows run (a long prompt does not stall their
rounds), one `prefill_chunk` with nothing running (a request that arrives meanwhile is taken at
the next step). A prompt that fits in what is left of the budget goes ahead of a longer one's
prefill: a chat's short turn does not wait for a pasted document's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from .events import RoundEvent
from .generation import _Run
from .loop import SpeculativeDecoder
from .prefill import Prefill
from .session import Session


@dataclass
class Waiting:
    rid: int
    prompt: list[int]
    run: _Run
    session: Session | None  # None: a fresh one
    cancel: Callable[[], bool] | None  # polled between prefill chunks
    on_prefill: Callable[[RoundEvent], None] | None
    added: float  # perf_counter() at `add`
    prefill: Prefill | None = None  # its prefill once begun (it joins when that is done)
    queue_ms: float = 0.0  # `add` -> the start of its prefill

    @property
    def remaining(self) -> int:
        """Prompt tokens still to feed (the whole prompt before its prefill begins)."""
        return self.prefill.remaining if self.prefill is not None else len(self.prompt)

    def let_go(self) -> None:
        """It leaves before it joined: its session is free, a begun prefill stopped between
        chunks (Prefill.roll_back: what it fed kept, or given back), else cleared on its next
        use."""
        if self.prefill is not None and not self.prefill.roll_back():
            self.prefill.session.in_round = True
        if self.session is not None:
            self.session.release()


def next_waiting(waiting: list[Waiting], budget: int) -> Waiting:
    """The first waiting request whose prompt (what is left of it) fits in `budget`, else
    the first."""
    return next((w for w in waiting if w.remaining <= budget), waiting[0])


def feed(decoder: SpeculativeDecoder, w: Waiting, budget: int, chunk: int) -> int:
    """Begin `w`'s prefill if needed and feed it whole chunks of at most `chunk` tokens
    (and the decoder's prefill_chunk) while they fit in `budget`; returns the budget left. A
    prefill begins (and its queue time ends) only when a chunk of it fits."""
    chunk = min(decoder.prefill_chunk, chunk)
    if w.prefill is None:
        if budget < min(chunk, len(w.prompt)):
            return budget
        session = w.session if w.session is not None else decoder.new_session()
        w.queue_ms = (time.perf_counter() - w.added) * 1000.0
        w.prefill = decoder._begin(session, w.prompt, w.cancel, w.run.params.prompt_logprobs)
    p = w.prefill
    while not p.done:
        n = min(chunk, p.remaining)
        if n > budget:
            break
        budget -= p.advance(n)
    return budget


def first_event(decoder: SpeculativeDecoder, w: Waiting, size: int) -> RoundEvent:
    """Its prefill is done: the first token (the prefill event, `size` rows in the batch it
    joins), shown to `on_prefill` while its session still holds its own caches."""
    event = decoder._first(w.prefill, w.run)
    event = replace(event, batch_size=size, queue_ms=w.queue_ms)
    if w.on_prefill is not None:
        w.on_prefill(event)
    return event
