"""Several generations in one speculative loop (continuous batching), each exactly as alone.

Every round, each active request proposes its own drafts (engine/batch_propose.py: one
drafter pass for the rows that need it), the proposals are cut to the round's width
(engine/width.py; only greedy rows are cut), then ONE target forward verifies all of them
(rows right-padded to the widest, each at its own positions), each request accepts with its
own sampling parameters and random key, and the target cache rolls each row back by its own
amount (target/batch.py). A lone row runs the single-sequence round over plain caches (no
per-row masks or offsets to pay for) and moves back into the batch cache when others join.
Requests join between rounds (prefilled alone, a chunk per step while others run:
engine/batch_join.py; then merged into the batch cache; their first token out before the next
round) and leave when they finish, fail or are cancelled. Per request, the proposal, the
acceptance rule and the key sequence are those of SpeculativeDecoder.stream, so a request
returns what it returns alone (up to the float rounding of a batched matmul: a near-tie).
Targets whose caches cannot be rolled back per row (target/batch.py `batchable`) run one
request at a time, as does max_batch=1. A request may bring its own `Session` (a prompt
cache's); when it leaves, its rows go back into that session as single-sequence caches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Sequence

import mlx.core as mx

from .. import defaults
from ..errors import ParameterError
from ..target import batch as tbatch
from .events import RoundEvent
from .batch_accept import accept_rows
from .batch_join import Waiting, feed, first_event, next_waiting
from .batch_propose import propose_rows
from .generation import GenerationParams, _Run
from .loop import SpeculativeDecoder
from .session import Session, prediction_used
from .prefill import _Cancelled
from .width import WidthRule
from ..values import is_int

# Requests verified together when the caller names no limit: 8 clients on a 2-core CPU got
# 106-111 tok/s at 8 vs 88-97 at 4 (docs/results/smollm2-serve-max-batch-amd.json). Each row
# holds its own KV cache: lower it where memory is short.
DEFAULT_MAX_BATCH = defaults.MAX_BATCH
# Prompt tokens a joining request prefills per step while others run. Measured on a 2-core
# CPU (docs/results/smollm2-join-stall.json, a 2,000-token join): a running stream's longest
# pause 28.8 s (whole prefill) -> 2.7 s, the joiner's first token as late as before; 64 pauses
# 1.7 s but delays the joiner's first token by 17 % (more rounds of the others in between).
DEFAULT_PREFILL_STEP = 128


@dataclass
class _Row:
    """One request in the loop: its conversation state and generation limits."""

    rid: int
    session: Session
    run: _Run
    done: bool = False
    failed: bool = False  # left with an error (its own code raised in a batched round)


@dataclass
class BatchDecoder:
    """Runs up to `max_batch` generations together; `add` queues one, `step` advances all."""

    decoder: SpeculativeDecoder
    max_batch: int = DEFAULT_MAX_BATCH
    rows: list[_Row] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    cache: tbatch.BatchCache | None = None  # the target's, one row per entry of `rows`
    fallback: str | None = None  # why this target runs one request at a time (None: batched)
    widths: WidthRule = field(default_factory=WidthRule)  # each round's verify width cap
    # Prompt tokens a joining request prefills per step while others run, in whole chunks of
    # at most this many (and at most the decoder's prefill_chunk).
    prefill_step: int = DEFAULT_PREFILL_STEP
    # applied to every request's params at `add` (Pair.batch: the tokenizer's EOS stops)
    defaults: Callable[[GenerationParams], GenerationParams] | None = None
    # rows keep their columns in position order (a sliding-window target: target/batch.py)
    _in_order: bool = field(default=False, init=False)
    _next_id: int = 0
    # request id -> when its last event was made (its wait between rounds: RoundEvent.wait_ms)
    _last_event: dict[int, float] = field(default_factory=dict, init=False)
    _held_last: bool = field(default=False, init=False)  # the last step ran no round: a joiner

    def __post_init__(self):
        for name in ("max_batch", "prefill_step"):
            if not is_int(getattr(self, name), 1):
                raise ParameterError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        self.fallback = tbatch.batchable(self.decoder.target)
        self._in_order = tbatch.windowed(self.decoder.target)

    @property
    def batched(self) -> bool:
        """Rows share one batch cache and one verify forward (else: one at a time, alone)."""
        return self.fallback is None and self.max_batch > 1

    @property
    def capacity(self) -> int:
        return self.max_batch if self.batched else 1

    @property
    def busy(self) -> bool:
        return bool(self.rows or self.waiting)

    def add(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        session: Session | None = None,
        cancel: Callable[[], bool] | None = None,
        on_prefill: Callable[[RoundEvent], None] | None = None,
    ) -> int:
        """Queue a generation (it joins at the next step with room); returns its id.
        `session`: continue it (its cached prefix is not prefilled again; it holds the
        request's caches again once the request has left). `cancel`: polled between prefill
        chunks; True drops the request (no event). `on_prefill`: called with the prefill
        event while `session` still holds the request's own caches, before they join the
        batch (a prompt cache notes that it finished its prefill); its
        prefill_ms runs from the start of its prefill to its first token (while others run,
        their rounds between its chunks included). Bad parameters raise ParameterError here,
        before anything runs. A session serves one generation at a time: it is held from
        here until the request leaves."""
        prompt, run = self._validated(prompt, params)
        return self._enqueue(prompt, run, session, cancel, on_prefill)

    def _validated(self, prompt, params: GenerationParams):
        """(prompt ids, the run) of a request, with this loop's defaults; ParameterError."""
        if self.defaults is not None:
            params = self.defaults(params)
        return self.decoder._validate(prompt, params)

    def _enqueue(self, prompt, run, session, cancel, on_prefill) -> int:
        self.decoder.check_session(session, cancel)  # another pair's, or in use: refused here
        if on_prefill is not None and not callable(on_prefill):
            raise ParameterError(f"on_prefill must be a callable or None, got {on_prefill!r}")
        if session is not None:
            session.hold(self)
        rid, self._next_id = self._next_id, self._next_id + 1
        now = time.perf_counter()  # its queue wait starts
        self.waiting.append(Waiting(rid, prompt, run, session, cancel, on_prefill, now))
        return rid

    def cancel(self, rid: int) -> bool:
        """Drop a generation now (a client that left): queued, or leaving the batch. False
        when no such generation runs or waits (it has already left, or never was)."""
        if not is_int(rid):
            raise ParameterError(f"cancel takes an id that add() returned, got {rid!r}")
        gone = [w for w in self.waiting if w.rid == rid]
        for w in gone:
            w.let_go()
        self.waiting = [w for w in self.waiting if w.rid != rid]
        rows = [row for row in self.rows if row.rid == rid]
        for row in rows:
            row.done = True
        self._leave()
        return bool(gone or rows)

    # ------------------------------------------------------------------ rounds
    def step(self) -> list[tuple[int, RoundEvent]]:
        """Admit waiting requests while there is room (their prefill events; while others
        run, a long prompt's prefill spans several steps), then run one round over every
        active request (not in a step where one joined, unless the last step was one too).
        Returns (request id, event) pairs; a request whose
        event has a finish_reason has left. A request whose own code raises (a logits
        processor, a grammar) leaves with an error event, the others go on, as does a row
        whose round runs alone (on its own caches) and fails; a batched round whose shared
        part (the drafter pass, the verify forward) raises leaves the batch cache mid-round:
        every running request leaves and the error is raised. A KeyboardInterrupt leaves
        the same way, and in a prefill, that request leaves (its session freed)."""
        events = self._join()
        joined = time.perf_counter()
        rounds: list[tuple[int, RoundEvent]] = []
        # A joiner's first token goes out before the next round: its time to first token is
        # its prefill's, and a stop string it completes ends it before any round. Not two
        # steps running, so a stream of joiners never holds the running rows up.
        waits = not self._held_last and any(e.prefill and not e.finish_reason for _, e in events)
        self._held_last = waits
        if self.rows and not waits:
            try:
                if not self.batched:
                    rounds = [(r.rid, self._single_round(r)) for r in self.rows]
                else:
                    rounds = self._batch_round()
            except BaseException:
                self._abandon()
                raise
            self._leave()
        out = self._timed(events, joined) + self._timed(rounds, time.perf_counter())
        active = {r.rid for r in self.rows}  # cancelled ones leave no time behind
        self._last_event = {r: t for r, t in self._last_event.items() if r in active}
        return out

    def _timed(self, events: list[tuple[int, RoundEvent]], now: float):
        """Each round's wait_ms: the wall time since its request's last event that its own
        draft and verify do not account for (the others' prefill chunks in between)."""
        out = []
        for rid, event in events:
            last = self._last_event.pop(rid, None)
            if last is not None and not event.prefill:
                wall = (now - last) * 1000.0
                wait = max(0.0, wall - event.draft_ms - event.verify_ms)
                event = replace(event, wait_ms=wait)
            if event.finish_reason is None:
                self._last_event[rid] = now
            out.append((rid, event))
        return out

    def _abandon(self) -> None:
        """Every running request leaves now; their sessions, caches torn mid-round, clear on
        their next use."""
        for row in self.rows:
            row.session.in_round = True
            row.session.release()
        self.rows, self.cache = [], None

    def _join(self) -> list[tuple[int, RoundEvent]]:
        """Admit waiting requests while there is room, one prefill at a time, a step's budget
        of prompt tokens (engine/batch_join.py); each joins the batch when its prefill is
        done."""
        events: list[tuple[int, RoundEvent]] = []
        joined: list[_Row] = []
        try:
            self._admit(events, joined)
        finally:  # an on_prefill that raised loses no admitted request
            if joined and self.batched:
                if self.rows:  # a row ran alone: its caches go first, so rows match cache rows
                    self._end_solo()
                new = tbatch.merge([r.session.target_cache for r in joined])
                self.cache = tbatch.extend(self.cache, new)
                for r in joined:
                    r.session.lend_target_cache()
            self.rows += joined
        return events

    def _admit(self, events: list, joined: list[_Row]) -> None:
        """A request whose prefill or on_prefill raises leaves alone, with an error event
        (finish_reason "error"); the others go on."""
        budget = self.prefill_step if self.rows else self.decoder.prefill_chunk
        while self.waiting and len(self.rows) + len(joined) < self.capacity:
            w = next_waiting(self.waiting, budget)
            running = bool(self.rows or joined)
            try:
                budget = feed(self.decoder, w, budget, self.prefill_step if running else budget)
                if w.prefill is None or not w.prefill.done:
                    break
                event = first_event(self.decoder, w, len(self.rows) + len(joined) + 1)
            except _Cancelled:
                self._drop(w)
                continue
            except Exception as e:  # this request's failure, not the batch's
                self._drop(w)
                events.append((w.rid, RoundEvent(tokens=[], finish_reason="error", error=e)))
                continue
            except BaseException:  # Ctrl-C mid-prefill: it leaves, as running rows do
                self._drop(w)
                raise
            self.waiting.remove(w)
            events.append((w.rid, event))
            if event.finish_reason is None:
                joined.append(_Row(w.rid, w.prefill.session, w.run))
            else:
                w.prefill.session.release()
            # a further prefill would hold back this one's next tokens
            budget = min(budget, self.prefill_step)

    def _drop(self, w: Waiting) -> None:
        """A waiting request leaves before it joined."""
        self.waiting.remove(w)
        w.let_go()

    def _leave(self) -> None:
        keep = [i for i, r in enumerate(self.rows) if not r.done]
        if len(keep) == len(self.rows):
            return
        for i, row in enumerate(self.rows):
            if row.done:
                if self.cache is not None:  # its rows of the batch cache go back to its session
                    row.session.return_target_cache(tbatch.extract(self.cache, i))
                if row.failed:  # its drafter's cache ran ahead: the session clears on next use
                    row.session.in_round = True
                row.session.release()
        self.rows = [self.rows[i] for i in keep]
        if self.cache is not None:
            if keep:
                tbatch.keep_rows(self.cache, keep)
            else:
                self.cache = None

    def _single_round(self, row: _Row) -> RoundEvent:
        """A row over its own caches: if its round raises, it alone leaves with the error
        (its session, marked mid-round, clears on its next use)."""
        try:
            event = self.decoder._round(row.session, row.run)
        except Exception as e:
            event = RoundEvent(tokens=[], finish_reason="error", error=e)
        row.done = event.finish_reason is not None
        return event

    def _batch_round(self) -> list[tuple[int, RoundEvent]]:
        if len(self.rows) == 1:
            return self._solo_round()
        self._end_solo()
        dec, rows = self.decoder, self.rows
        pairs = [(r.session, r.run) for r in rows]
        t0 = time.perf_counter()
        proposals, verify_keys, errors = propose_rows(dec, pairs)
        proposals = self.widths.cap(proposals, [not r.run.params.sampling.greedy for r in rows])
        draft_ms = (time.perf_counter() - t0) * 1000.0  # one pass for all: each row waited it
        width = max(len(p.drafts) for p in proposals) + 1
        ids = [
            [r.session.tokens[-1]] + p.drafts + [0] * (width - 1 - len(p.drafts))
            for r, p in zip(rows, proposals)
        ]
        t1 = time.perf_counter()
        fwd = dec.target.forward(mx.array(ids), self.cache.layers)
        mx.eval(fwd.logits)  # its failure is the batch's, not the first row's to accept
        outcomes = accept_rows(pairs, proposals, verify_keys, errors, fwd, self.widths)
        keeps = [len(o.commit) for o in outcomes]  # a failed row keeps none of the round
        tbatch.rollback(self.cache, fwd, keeps, width, self._in_order)
        mx.eval([r.session.pending for r in rows], [c.state for c in self.cache.layers])
        verify_ms = (time.perf_counter() - t1) * 1000.0
        events = []
        for row, p, o in zip(rows, proposals, outcomes):
            row.done, row.failed = o.finish is not None, o.error is not None
            event = RoundEvent(
                tokens=o.commit,
                drafted=o.drafted,
                accepted=o.accepted,
                block_size=len(p.drafts) + 1,
                draft_ms=draft_ms,
                verify_ms=verify_ms,
                finish_reason=o.finish,
                source=p.source,
                batch_size=len(rows),
                logprobs=o.logprobs,
                error=o.error,
                prediction_used=prediction_used(row.session),
            )
            events.append((row.rid, event))
        return events

    def _solo_round(self) -> list[tuple[int, RoundEvent]]:
        """One row: the single-sequence engine's round over plain caches (no per-row mask,
        offsets or padding to pay for), so one request runs as fast as it does alone."""
        row = self.rows[0]
        if self.cache is not None:  # its caches move out of the batch cache (one copy)
            row.session.return_target_cache(tbatch.extract(self.cache, 0))
            self.cache = None
        return [(row.rid, replace(self._single_round(row), batch_size=1))]

    def _end_solo(self) -> None:
        """Requests joined a row that ran alone: its caches go back in front of the batch's."""
        solo = self.rows[0].session
        if solo.target_cache:
            own = tbatch.merge([solo.target_cache])
            self.cache = own if self.cache is None else tbatch.extend(own, self.cache)
            solo.lend_target_cache()

    # ------------------------------------------------------------------ whole runs
    def stream(
        self, requests: Iterable[tuple[Sequence[int], GenerationParams]]
    ) -> Iterator[tuple[int, RoundEvent]]:
        """Run `requests` (prompt ids, params) to the end, up to `max_batch` at a time;
        yields (index into requests, event). All are validated here, at the call: a bad one
        raises before any runs (as `stream` does alone)."""
        validated = []
        for i, (p, params) in enumerate(list(requests)):
            try:  # the constraint factory runs here, once a generation
                validated.append(self._validated(p, params))
            except ParameterError as e:  # which of them it is
                raise ParameterError(f"request {i} of the batch: {e}") from None
        return self._run(validated)

    def _run(self, validated: list) -> Iterator[tuple[int, RoundEvent]]:
        if self.busy:  # another stream() runs (begun, maybe, since this one was made)
            raise RuntimeError("stream() runs its own requests: this BatchDecoder is busy")
        ids: dict[int, int] = {}
        try:
            for i, (prompt, run) in enumerate(validated):
                ids[self._enqueue(prompt, run, None, None, None)] = i
            while self.busy:
                for rid, event in self.step():
                    if event.error is not None:  # one failed: the run ends with its error
                        raise event.error
                    yield ids[rid], event
        finally:  # a bad request, a failure, a consumer that stopped: none runs on
            for rid in ids:
                self.cancel(rid)

    def generate(
        self, requests: Iterable[tuple[Sequence[int], GenerationParams]]
    ) -> list[list[int]]:
        requests = list(requests)
        out: list[list[int]] = [[] for _ in requests]
        for i, event in self.stream(requests):
            out[i].extend(event.tokens)
        return out
