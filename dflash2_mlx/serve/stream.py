"""A request's items as the HTTP layer reads them, and its SSE response.

A stream whose first token is slow to come (a long prefill, a queue behind other requests)
opens at once after `keepalive_s` and sends an SSE comment every `keepalive_s` until it comes:
clients give up on a response whose headers or bytes do not arrive in time (Node's fetch waits
300 s for headers), and SSE clients ignore comments.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request
from fastapi.responses import StreamingResponse

from .jobs import Item, Job

SSE_KEEPALIVE = ": keep-alive\n\n"
PENDING = Item("pending")  # `Reader.next` timed out: nothing yet
UNREAD = Item("unread")  # not read yet (a choice after the first, its stream already open)


class Reader:
    """Reads a job's items; optionally notices a client that left (at once: the server's
    receive() answers http.disconnect when the connection closes)."""

    def __init__(self, job: Job, request: Request):
        self.job, self.request = job, request
        self._get: asyncio.Task | None = None
        self._gone: asyncio.Task | None = None  # done once the client has left
        self.finished = False  # saw "done" or "error": the worker is through with the job
        self.failed = False  # saw "error"

    async def next(self, watch_client: bool, timeout: float | None = None) -> Item | None:
        """The next item, None if the client has gone (with `watch_client`), or PENDING
        after `timeout` seconds without one (None: no limit)."""
        if self._get is None:
            self._get = asyncio.ensure_future(self.job.out.get())
        waits = {self._get}
        if watch_client:
            if self._gone is None:
                self._gone = asyncio.ensure_future(self._client_left())
            waits.add(self._gone)
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if self._gone in done:
            return None
        if self._get in done:
            item, self._get = self._get.result(), None
            self.finished = item.kind in ("done", "error")
            self.failed = item.kind == "error"
            return item
        return PENDING

    async def _client_left(self) -> None:
        """Returns when the connection closes (its body is read: nothing else comes)."""
        while (await self.request.receive())["type"] != "http.disconnect":
            pass

    def close(self) -> None:
        for task in (self._get, self._gone):
            if task is not None:
                task.cancel()
        self._get = self._gone = None

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
