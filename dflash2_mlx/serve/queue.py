"""One worker thread runs one generation at a time; requests wait in a bounded queue.

MLX on one device does not run generations concurrently, so the server serialises them. A
request reserves a place first (`reserve`: it holds it while its prompt is tokenized), then
the event loop submits its `Job`; the worker streams its text chunks back into the job's
asyncio queue. A cancelled job (client gone) is skipped if still waiting, or stopped between
prefill chunks and between rounds. On shutdown (`close`) waiting jobs are answered with
`ShuttingDown`; `cut` stops the running one with it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from ..engine.loop import GenerationParams
from ..engine.prompt_cache import PromptCache
from ..errors import DFlash2Error
from ..text import stream_text
from .metrics import Metrics

log = logging.getLogger("dflash2.serve")


RETRY_EWMA = 0.3  # weight of the latest generation in the per-request time estimate
_job_ids = itertools.count(1)


class QueueFull(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy; retry in {retry_after} s")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    def __init__(self):
        super().__init__("the server is shutting down")


@dataclass
class Item:
    """What the worker sends back: a chunk of text, then "done"; or one "error"."""

    kind: str  # "chunk" | "done" | "error"
    text: str = ""
    finish_reason: str | None = None
    event: object = None  # the RoundEvent of a chunk
    error: BaseException | None = None


class Job:
    def __init__(self, prompt_ids: Sequence[int], params: GenerationParams, stop: Sequence[str]):
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.stop = list(stop)
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue[Item] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.state = "waiting"  # waiting -> running -> done, or waiting -> cancelled
        self.stopped_by: BaseException | None = None  # the server stopped it (not the client)
        self.id = next(_job_ids)

    def emit(self, item: Item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.cancelled.set()


class Worker:
    """Admits at most `max_queue` waiting jobs besides the one generating."""

    def __init__(
        self, pair, max_queue: int, metrics: Metrics, prompt_cache: PromptCache | None = None
    ):
        self.pair = pair
        self.max_queue = max_queue
        self.metrics = metrics
        self.prompt_cache = prompt_cache  # None: every job starts from a fresh session
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.waiting = 0  # places reserved: tokenizing or queued
        self.running = 0
        self.closing = False
        self.recent_seconds: float | None = None  # EWMA of recent generations' wall time
        self._queued: set[Job] = set()
        self._current: Job | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ event loop side
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dflash2-worker", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            current = self._current
            if current is not None:
                current.cancelled.set()
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def reserve(self) -> None:
        """Take a place in the queue (before tokenizing); QueueFull / ShuttingDown if none."""
        with self._lock:
            if self.closing:
                raise ShuttingDown()
            if self.waiting + self.running > self.max_queue:
                raise QueueFull(self._retry_after())
            self.waiting += 1
            self._publish()

    def unreserve(self) -> None:
        """Give back a reserved place that will not be submitted."""
        with self._lock:
            self.waiting -= 1
            self._publish()

    def submit(self, job: Job) -> None:
        """Queue a job in the place reserved for it."""
        with self._lock:
            if self.closing:
                self.waiting -= 1
                self._publish()
                raise ShuttingDown()
            self._queued.add(job)
        self._jobs.put(job)

    def cancel(self, job: Job) -> None:
        """The client left: drop the job if waiting, stop it if running."""
        job.cancelled.set()
        with self._lock:
            if job.state == "waiting":
                job.state = "cancelled"
                self._queued.discard(job)
                self.waiting -= 1
                self.metrics.count_dropped()
                self._publish()
                log.info("job %d cancelled while waiting: the client left", job.id)

    def close(self) -> None:
        """Shutdown begins: refuse new jobs, answer the waiting ones with ShuttingDown."""
        with self._lock:
            self.closing = True
            dropped = [j for j in self._queued if j.state == "waiting"]
            for job in dropped:
                job.state = "cancelled"
                job.cancelled.set()
                self.waiting -= 1
            self._queued.clear()
            self._publish()
        for job in dropped:
            job.emit(Item("error", error=ShuttingDown()))

    def cut(self, reason: BaseException) -> None:
        """Stop the running job (at its next prefill chunk or round); it ends with `reason`."""
        with self._lock:
            job = self._current
            if job is not None and not job.cancelled.is_set():
                job.stopped_by = reason
                job.cancelled.set()

    def _retry_after(self) -> int:
        per_job = self.recent_seconds or 1.0
        return max(1, min(3600, math.ceil(per_job * (self.waiting + self.running))))

    def _publish(self) -> None:
        self.metrics.set_queue(self.waiting, self.running)

    # ------------------------------------------------------------ worker side
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.state != "waiting":
                    continue
                job.state = "running"
                self._queued.discard(job)
                self.waiting -= 1
                self.running = 1
                self._current = job
                self._publish()
            t0 = time.perf_counter()
            try:
                self._generate(job)
            finally:
                seconds = time.perf_counter() - t0
                with self._lock:
                    job.state = "done"
                    self.running = 0
                    self._current = None
                    self.recent_seconds = (
                        seconds
                        if self.recent_seconds is None
                        else (RETRY_EWMA * seconds + (1 - RETRY_EWMA) * self.recent_seconds)
                    )
                    self._publish()
                self.metrics.count_generation(seconds, job.cancelled.is_set())

    def _generate(self, job: Job) -> None:
        chunks = lease = None
        produced = 0
        try:
            if job.cancelled.is_set():
                return
            if self.prompt_cache is not None:
                lease = self.prompt_cache.lease(job.prompt_ids)
            chunks = stream_text(
                self.pair,
                job.prompt_ids,
                job.params,
                job.stop,
                session=lease.session if lease else None,
                cancel=job.cancelled.is_set,
            )
            for chunk in chunks:
                if lease is not None:
                    lease.observe(chunk.event)
                self.metrics.count_event(chunk.event)
                produced += len(chunk.event.tokens)
                job.emit(Item("chunk", chunk.text, chunk.finish_reason, chunk.event))
                if job.cancelled.is_set():
                    break
            if job.cancelled.is_set():
                why = "the server is shutting down" if job.stopped_by else "the client left"
                when = (
                    f"after {produced} generated tokens"
                    if produced
                    else f"during the prefill of its {len(job.prompt_ids)} prompt tokens"
                )
                log.info("job %d cancelled %s: %s", job.id, when, why)
                if job.stopped_by is not None:
                    job.emit(Item("error", error=job.stopped_by))
                return
            job.emit(Item("done"))
        except DFlash2Error as e:
            job.emit(Item("error", error=e))
        except Exception as e:  # a server bug: log it, answer 500, keep serving
            log.exception("generation failed")
            job.emit(Item("error", error=e))
        finally:
            if chunks is not None:
                chunks.close()
            if lease is not None:  # after close: the session is between rounds again
                lease.close()
