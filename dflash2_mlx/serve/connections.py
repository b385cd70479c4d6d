"""uvicorn's HTTP/1.1 protocol (h11) with a deadline on each request head, and a JSON 503
with Retry-After past its connection limit (uvicorn's is plain text, unlike the app's own).

uvicorn times nothing until a response has gone out, and its keep-alive timer stops at the
first byte of a next request: a client that opens a connection and sends nothing, or a few
header bytes now and then, holds one of the server's connections for as long as it likes, and
`MAX_CONNECTIONS` of them refuse everyone else (a measured 999 idle sockets made /health a
503). Here a connection that has not sent a whole request head `head_s` seconds after it
opened, or after its last response, is closed; and a connection that opens at the limit
closes the ones that have gone longest without sending a byte among those that are not
generating (waiting for a request head, or for the rest of a request's body), so a client
that keeps reopening sockets, or sends heads without bodies, cannot fill the limit either.
Only connections whose requests all run refuse a newcomer (the JSON 503).
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from .api_error import APIError
from .messages_output import MESSAGES_PATH, error_body


# Request tasks held at once, per connection allowed: tasks outlive the connections closed to
# make room until they unwind (a fast flood refused every request on tasks alone: 1,187 tasks
# with 227 connections open, a reviewer's count).
TASKS_PER_CONNECTION = 4


class TimedHeadProtocol(H11Protocol):
    """H11Protocol closing a connection whose request head does not come within `head_s`,
    and answering a request past the connection limit with `too_many_connections`."""

    head_s: float = 30.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cap, self.limit_concurrency = self.limit_concurrency, None  # checked here

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._heard = self.loop.time()  # its last byte's time
        self._arm_head_timer()
        if self.cap is not None and len(self.connections) >= self.cap:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        self._heard = self.loop.time()
        super().data_received(data)

    def handle_events(self) -> None:
        cycle, app = self.cycle, self.app
        if self._at_limit():
            self.app = too_many_connections  # for requests whose heads come now
        try:
            super().handle_events()
        finally:
            self.app = app
        if self.cycle is not cycle and self._head_timer is not None:  # a request head came
            self._head_timer.cancel()
            self._head_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle.response_complete:  # no pipelined request began: wait for the next head
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _at_limit(self) -> bool:
        cap = self.cap
        if cap is None or (
            len(self.connections) < cap and len(self.tasks) < TASKS_PER_CONNECTION * cap
        ):
            return False
        # a connection closed to make room leaves the set a moment later, and its request's
        # task once it has unwound (a flood can leave many unwinding: they are not counted
        # against the limit up to a bound)
        return len(self.tasks) >= TASKS_PER_CONNECTION * cap or self._open() >= cap

    def _open(self) -> int:
        """Connections open, those closed to make room but not yet gone left out."""
        return sum(not c.transport.is_closing() for c in self.connections)

    def _make_room(self) -> None:
        """Close the connections not generating that have gone longest without a byte (not
        this one), so that this one's request is below the limit."""
        excess = self._open() - self.cap + 1
        idle = [c for c in self.connections if c is not self and _not_generating(c)]
        if excess > 0 and idle:
            say_once_a_minute("at the connection limit: the longest idle connections are closed")
            for c in sorted(idle, key=lambda c: c._heard)[:excess]:
                c.transport.close()

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_s, self._head_too_late)

    def _head_too_late(self) -> None:
        self._head_timer = None
        waiting = self.cycle is None or self.cycle.response_complete  # no request running
        if waiting and not self.transport.is_closing():
            self.transport.close()


def _not_generating(c) -> bool:
    """A connection of this protocol, open, waiting for a request head or for the rest of a
    request's body (closing it stops no generation)."""
    if not isinstance(c, TimedHeadProtocol) or c.transport.is_closing():
        return False
    return c.cycle is None or c.cycle.response_complete or c.cycle.more_body


log = logging.getLogger("dflash2.serve")
_SAID: dict[str, float] = {}  # when each key's line was last said in the log


def say_once_a_minute(line: str, level: int = logging.WARNING, key: str | None = None) -> None:
    """`line` in the server's log, unless a line of its `key` (the line itself) was said in
    the last minute (a flood would otherwise write one for each connection)."""
    now, key = time.monotonic(), key or line
    if now - _SAID.get(key, -float("inf")) >= 60.0:
        _SAID[key] = now
        log.log(level, line)


TOO_MANY = APIError(
    503,
    "the server holds as many connections as it may: retry shortly",
    type="server_error",
    code="too_many_connections",
    headers={"Retry-After": "1", "Connection": "close"},
)


async def too_many_connections(scope, receive, send) -> None:
    """The answer past the connection limit, as the app's own 503s: JSON (Anthropic's shape
    on its path) with Retry-After; said in the log once a minute at most (a flood)."""
    say_once_a_minute("at the connection limit: requests are refused (503) until some close")
    anthropic = str(scope.get("path", "")).startswith(MESSAGES_PATH)
    body = error_body(TOO_MANY) if anthropic else TOO_MANY.body()
    await JSONResponse(body, 503, headers=TOO_MANY.headers)(scope, receive, send)


def timed_head_protocol(head_s: float) -> type[TimedHeadProtocol]:
    """The protocol class for a server whose request heads must come within `head_s`."""
    return type("TimedHeadProtocol", (TimedHeadProtocol,), {"head_s": head_s})
