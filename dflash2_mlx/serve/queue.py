"""Admission: a bounded queue in front of the worker thread that generates (serve/scheduler.py).

MLX runs on one thread, so one worker thread runs every generation; up to `max_batch` of them
together in one batched speculative loop, the others wait. A request reserves a place first
(`reserve`: it holds it while its prompt is tokenized), then the event loop submits its `Job`;
the worker streams its text chunks back into the job's asyncio queue. A cancelled job (client
gone) is skipped if still waiting, or leaves the batch between prefill chunks and rounds. On
shutdown (`close`) waiting jobs are answered with `ShuttingDown`; `cut` stops the running ones
with it.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Callable

import mlx.core as mx

from ..engine.batch import DEFAULT_MAX_BATCH
from ..engine.prompt_cache import PromptCache
from .jobs import Item, Job, QueueFull, ShuttingDown
from .metrics import Metrics
from .scheduler import Scheduler

__all__ = ["Item", "Job", "QueueFull", "ShuttingDown", "Worker"]

log = logging.getLogger("dflash2.serve")

RETRY_EWMA = 0.3  # weight of the latest generation in the per-request time estimate


def _run_then_clear(run: Callable, jobs) -> None:
    """The worker thread: the scheduler's loop, then MLX's cleanup of this thread's streams,
    which MLX asks of every thread that ran MLX work (without it the process may abort at
    exit: "terminate called without an active exception")."""
    try:
        run(jobs)
    finally:
        clear = getattr(mx, "clear_streams", None)  # MLX >= 0.32
        if clear is not None:
            clear()


class Worker:
    """Admits at most `max_queue` waiting jobs besides the `capacity` generating together.

    `capacity`: max_batch, or 1 for a target that cannot be batched (BatchDecoder.fallback)."""

    def __init__(
        self,
        pair,
        max_queue: int,
        metrics: Metrics,
        prompt_cache: PromptCache | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        width_cost: Callable[[int, int], float] | None = None,
    ):
        self.max_queue = max_queue
        self.metrics = metrics
        self.scheduler = Scheduler(self, pair, max_batch, prompt_cache, width_cost)
        self.capacity = self.scheduler.batch.capacity
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.waiting = 0  # places reserved: tokenizing or queued
        self.running = 0
        self.closing = False
        self.recent_seconds: float | None = None  # EWMA of recent generations' wall time
        self._queued: set[Job] = set()
        self._running: set[Job] = set()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ event loop side
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=_run_then_clear, args=(self.scheduler.run, self._jobs), daemon=True
            )
            self._thread.name = "dflash2-worker"
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            with self._lock:
                for job in self._running:
                    job.cancelled.set()
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def reserve(self, count: int = 1) -> None:
        """Take `count` places in the queue (before tokenizing), all or none; QueueFull /
        ShuttingDown if they are not there."""
        with self._lock:
            if self.closing:
                raise ShuttingDown()
            if self.waiting + self.running + count > self.max_queue + self.capacity:
                raise QueueFull(self._retry_after())
            self.waiting += count
            self._publish()

    def unreserve(self, count: int = 1) -> None:
        """Give back reserved places that will not be submitted."""
        with self._lock:
            self.waiting -= count
            self._publish()

    def submit(self, job: Job) -> None:
        """Queue a job in the place reserved for it."""
        with self._lock:
            if self.closing:
                self.waiting -= 1
                self._publish()
                raise ShuttingDown()
            self._queued.add(job)
        job.submitted = time.perf_counter()
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
                log.info("%s cancelled while waiting: the client left", job.name)

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
        """Stop every running job (at its next prefill chunk or round); each ends with `reason`."""
        with self._lock:
            for job in self._running:
                if not job.cancelled.is_set():
                    job.stopped_by = reason
                    job.cancelled.set()

    def _retry_after(self) -> int:
        per_job = self.recent_seconds
        if per_job is None:  # none finished yet: the longest running so far, at least
            now = time.perf_counter()
            per_job = max([1.0] + [now - j.began for j in self._running if j.began])
        ahead = (self.waiting + self.running) / self.capacity  # batches' worth of requests
        return max(1, min(3600, math.ceil(per_job * ahead)))

    def _publish(self) -> None:
        self.metrics.set_queue(self.waiting, self.running)

    # ------------------------------------------------------------ worker side
    def begin(self, job: Job) -> bool:
        """A waiting job starts (False: it was cancelled meanwhile, or the server closed)."""
        with self._lock:
            if job.state != "waiting":
                return False
            job.state = "running"
            job.began = time.perf_counter()
            self._queued.discard(job)
            self._running.add(job)
            self.waiting -= 1
            self.running += 1
            self._publish()
            return True

    def end(self, job: Job, seconds: float) -> None:
        """A running job is through (finished, failed or cancelled) after `seconds`."""
        with self._lock:
            job.state = "done"
            self._running.discard(job)
            self.running -= 1
            self.recent_seconds = (
                seconds
                if self.recent_seconds is None
                else (RETRY_EWMA * seconds + (1 - RETRY_EWMA) * self.recent_seconds)
            )
            self._publish()
        self.metrics.count_generation(seconds, job.cancelled.is_set())
