"""A request's items as the HTTP layer reads them, and its SSE response.

A stream whose first token is slow to come (a long prefill, a queue behind other requests)
opens at once after `keepalive_s` and sends an SSE comment every `keepalive_s` until it comes:
clients give up on a response whose headers or bytes do not arrive in time (Node's fetch waits
300 s for headers), and SSE clients ignore comments.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from .jobs import Item, Job

DISCONNECT_POLL_S = 0.2
SSE_KEEPALIVE = ": keep-alive\n\n"
PENDING = Item("pending")  # `Reader.next` timed out: nothing yet
UNREAD = Item("unread")  # not read yet (a choice after the first, its stream already open)


class Reader:
    """Reads a job's items; optionally notices a client that left (polled)."""

    def __init__(self, job: Job, request: Request):
        self.job, self.request = job, request
        self._get: asyncio.Task | None = None
        self.finished = False  # saw "done" or "error": the worker is through with the job
        self.failed = False  # saw "error"
        self._polled = time.monotonic()

    async def next(self, poll_disconnect: bool, timeout: float | None = None) -> Item | None:
        """The next item, None if the client has gone (checked every DISCONNECT_POLL_S), or
        PENDING after `timeout` seconds without one (None: no limit)."""
        if self._get is None:
            self._get = asyncio.ensure_future(self.job.out.get())
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            waits = [] if deadline is None else [max(0.0, deadline - time.monotonic())]
            if poll_disconnect:
                waits.append(max(0.0, self._polled + DISCONNECT_POLL_S - time.monotonic()))
            done, _ = await asyncio.wait({self._get}, timeout=min(waits, default=None))
            if poll_disconnect and time.monotonic() - self._polled >= DISCONNECT_POLL_S:
                self._polled = time.monotonic()
                if await self.request.is_disconnected():
                    return None
            if done:
                item, self._get = self._get.result(), None
                self.finished = item.kind in ("done", "error")
                self.failed = item.kind == "error"
                return item
            if deadline is not None and time.monotonic() >= deadline:
                return PENDING

    def close(self) -> None:
        if self._get is not None:
            self._get.cancel()
            self._get = None

    def release(self, worker) -> None:
        """Stop reading; the worker cancels the job unless it is through with it."""
        self.close()
        if not self.finished:
            worker.cancel(self.job)


class SSEResponse(StreamingResponse):
    """A stream that releases its job however it ends, even if never iterated."""

    def __init__(self, content, release):
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
            with contextlib.suppress(RuntimeError):
                await self.body_iterator.aclose()
