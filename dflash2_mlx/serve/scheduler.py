"""The worker thread's loop: every running request in one batched speculative loop.

The scheduler owns a `BatchDecoder` (engine/batch.py); every MLX call runs on its thread. While
requests run, the jobs submitted meanwhile are taken without blocking and join between rounds
as rows free up (at most `max_batch` run together); with nothing to run it blocks on the
queue. Each running job has its own text stream (incremental detokenization, stop strings): a
stop string finishes that job and its row leaves the batch; so does a job whose client left
(`job.cancelled`, polled between prefill chunks and between rounds) without disturbing the
others. With a prompt cache each job starts from its lease's session (only the uncached suffix
is prefilled) and hands its caches back to it when it leaves. A job that asks for its
prompt's own log-probabilities (`Job.score`) has them read off its prefill's rows
(GenerationParams.prompt_logprobs: the whole prompt is fed); one that generates nothing
(max_tokens 0) has its prompt scored a chunk per loop between the batch's steps
(engine/scoring.py).
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

import mlx.core as mx

from ..engine.events import RoundEvent
from ..engine.prompt_cache import Lease, PromptCache
from ..engine.scoring import PromptScoring
from ..errors import DFlash2Error
from ..text import EventText
from .jobs import Item, Job

log = logging.getLogger("dflash2.serve")


@dataclass
class _Running:
    """A job in the batch: its row id, its text, its prompt-cache lease."""

    job: Job
    started: float  # perf_counter() when it left the queue
    waited_ms: float  # submit -> handed to the batch (the batch adds its own wait)
    text: EventText | None = None
    lease: Lease | None = None
    scoring: PromptScoring | None = None  # its prompt's log-probabilities, before it runs
    rid: int = -1
    produced: int = 0
    finished: bool = False


class Scheduler:
    """Runs the jobs of a `Worker` (serve/queue.py: admission and bookkeeping)."""

    def __init__(
        self,
        worker,
        pair,
        max_batch: int,
        prompt_cache: PromptCache | None,
        width_cost: Callable[[int, int], float] | None = None,
    ):
        self.worker, self.pair, self.prompt_cache = worker, pair, prompt_cache
        self.metrics = worker.metrics
        self.max_batch, self.width_cost = max_batch, width_cost
        self.batch = pair.batch(max_batch, width_cost)
        self.running: dict[int, _Running] = {}  # by row id
        self.pending: deque[Job] = deque()  # taken from the queue, no room yet
        self.scoring: deque[_Running] = deque()  # having their prompts scored, in turn

    def run(self, jobs: queue.Queue) -> None:
        died: BaseException | None = None
        try:
            while self._take(jobs):
                try:
                    self._sweep()
                    self._admit()
                    if self.scoring:
                        self._score()
                    if self.batch.busy:
                        self._step()
                except Exception as e:  # the running jobs get the error; the worker goes on
                    self._fail_all(e)
        except Exception as e:  # nothing caught it: the worker thread ends (logged here)
            died = e
            log.critical("the generation worker stopped; the server refuses requests", exc_info=e)
        finally:  # stopping: new and queued jobs are refused (503); the running ones end here
            self.worker.close()
            for r in [*self.running.values(), *self.scoring]:
                if died is not None and r.job.stopped_by is None:
                    r.job.stopped_by = died  # its client gets the error, not a silent hang
                r.job.cancelled.set()
            self._sweep()

    def _take(self, jobs: queue.Queue) -> bool:
        """Move submitted jobs to `pending`, waiting for one only when nothing runs.
        False: the worker is stopping."""
        block = not self.running and not self.pending and not self.scoring
        if block:  # idle: MLX's buffer cache (a prefill's intermediates) goes back to the OS
            mx.clear_cache()
        while True:
            try:
                job = jobs.get(block=block)
            except queue.Empty:
                return True
            if job is None:
                return False
            self.pending.append(job)
            block = False

    def _admit(self) -> None:
        """Hand waiting jobs to the batch while it has room (they prefill at the next step);
        a job to score first holds its room meanwhile."""
        b = self.batch
        while self.pending and len(b.rows) + len(b.waiting) + len(self.scoring) < b.capacity:
            job = self.pending.popleft()
            if not self.worker.begin(job):  # cancelled while waiting, or the server closed
                continue
            now = time.perf_counter()
            r = _Running(job, now, (now - job.submitted) * 1000.0)
            if job.score is not None and not job.generate:  # scored, nothing generated
                try:
                    r.scoring = PromptScoring(self.pair.decoder.target, job.prompt_ids, job.score)
                except Exception as e:  # bad ids (400), or a server bug (500)
                    self._fail(r, e)
                    continue
                self.scoring.append(r)
                self.metrics.observe_queue_wait(r.waited_ms / 1000.0)
            elif job.generate:
                self._join(r)
            else:  # only its prompt echoed
                self.metrics.observe_queue_wait(r.waited_ms / 1000.0)
                self._finish(r, Item("done"))

    def _join(self, r: _Running) -> None:
        """The job's row joins the batch (its prefill runs at the next step)."""
        job = r.job
        try:
            params = self.pair.with_defaults(job.params)
            if job.score is not None:  # scored by its own prefill, which then reads it all
                params = replace(params, prompt_logprobs=job.score)
            r.text = EventText(self.pair, job.prompt_ids, params, job.stop, job.hidden)
            if self.prompt_cache is not None:
                r.lease = self.prompt_cache.lease(job.prompt_ids, (job.preamble,))
            r.rid = self.batch.add(
                job.prompt_ids,
                params,
                session=r.lease.session if r.lease else None,
                cancel=job.cancelled.is_set,
                on_prefill=r.lease.observe if r.lease else None,
            )
        except Exception as e:  # bad parameters (400), or a server bug (500)
            self._fail(r, e)
            return
        self.running[r.rid] = r

    def _score(self) -> None:
        """The next chunk of the first scoring job's prompt; once scored, its log-probabilities
        go out and it ends."""
        r = self.scoring[0]
        try:
            r.scoring.advance()
        except Exception as e:
            self.scoring.popleft()
            self._fail(r, e)
            return
        if not r.scoring.done:
            return
        self.scoring.popleft()
        r.job.emit(Item("scores", event=tuple(r.scoring.result)))
        self.metrics.count_scored(len(r.job.prompt_ids))
        r.scoring = None
        self._finish(r, Item("done"))

    def _step(self) -> None:
        events = self.batch.step()
        rows = [ev.batch_size for _, ev in events if not ev.prefill]
        if rows:
            self.metrics.count_batch_round(max(rows))
        for rid, event in events:
            r = self.running.get(rid)
            if r is None:
                continue
            if event.error is not None:  # its prefill or its own code failed: it alone ends
                self._fail(r, event.error)
                continue
            try:
                self._deliver(r, event)
            except Exception as e:  # this job's text failed: it alone ends, with the error
                self.batch.cancel(r.rid)
                self._fail(r, e)

    def _deliver(self, r: _Running, event: RoundEvent) -> None:
        if event.prefill:
            event = replace(event, queue_ms=event.queue_ms + r.waited_ms)
            self.metrics.observe_queue_wait(event.queue_ms / 1000.0)
            if event.prompt_logprobs is not None:
                r.job.emit(Item("scores", event=event.prompt_logprobs))
                self.metrics.count_scored(len(r.job.prompt_ids))
        self.metrics.count_event(event)
        r.produced += len(event.tokens)
        chunk = r.text.chunk(event)
        r.job.emit(Item("chunk", chunk.text, chunk.finish_reason, chunk.event, stop=chunk.stop))
        if chunk.finish_reason is None:
            return
        if event.finish_reason is None:  # a stop string: its row leaves now
            self.batch.cancel(r.rid)
        self._finish(r, Item("done"))

    def _sweep(self) -> None:
        """Jobs cancelled by their client or the server leave the batch at once."""
        for r in [r for r in self.scoring if r.job.cancelled.is_set()]:
            self.scoring.remove(r)
            self._cancelled(r, f"while its {len(r.job.prompt_ids)} prompt tokens were scored")
        for r in [r for r in self.running.values() if r.job.cancelled.is_set()]:
            self.batch.cancel(r.rid)
            when = (
                f"after {r.produced} generated tokens"
                if r.produced
                else f"during the prefill of its {len(r.job.prompt_ids)} prompt tokens"
            )
            self._cancelled(r, when)

    def _cancelled(self, r: _Running, when: str) -> None:
        job = r.job
        why = "the server is shutting down" if job.stopped_by else "the client left"
        log.info("%s cancelled %s: %s", job.name, when, why)
        stopped = job.stopped_by
        self._finish(r, None if stopped is None else Item("error", error=stopped))

    def _finish(self, r: _Running, last: Item | None = None) -> None:
        """The job is through and its row has left the batch: its session goes back. `last`
        (done, or an error) reaches the client after its place is free and its turn cached,
        so a next request it sends at once finds both."""
        if r.finished:
            return
        r.finished = True
        self.running.pop(r.rid, None)
        try:
            if r.lease is not None:
                r.lease.close()
        finally:
            self.worker.end(r.job, time.perf_counter() - r.started)
            if last is not None:
                r.job.emit(last)

    def _fail(self, r: _Running, e: Exception, logged: bool = False) -> None:
        """The job ends with `e` (a server bug: logged once, answered 500); its state is not
        kept for a next turn."""
        if not (logged or isinstance(e, DFlash2Error)):
            log.error("generation of %s failed", r.job.name, exc_info=e)
        if r.finished:
            return
        if r.lease is not None and r.rid >= 0:  # it ran: maybe not consistent, never stored
            r.lease.session.in_round = True
        self._finish(r, Item("error", error=e))

    def _fail_all(self, e: Exception) -> None:
        """A step failed: every running job gets the error; the batch starts over."""
        if not isinstance(e, DFlash2Error):
            log.exception("generation failed: %d running requests end", len(self.running))
        for r in list(self.running.values()):  # the jobs being scored are not in it
            self._fail(r, e, logged=True)
        self.batch = self.pair.batch(self.max_batch, self.width_cost)
