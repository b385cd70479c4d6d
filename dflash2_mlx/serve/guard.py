"""The last line of defence: an exception no route handled becomes one JSON 500.

Starlette's own fallback answers 500 and then re-raises, so every fault is logged twice (once
by the app, once by uvicorn, whole tracebacks) and the keep-alive connection drops. Here a
fault is logged once, answered once (when the response has not started) and the connection
lives on; a stream that fails midway just ends. A request the server cuts as it quits at once
(a second Ctrl-C) gets a JSON 503, not uvicorn's plain-text 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi.responses import JSONResponse

from .api_error import loggable
from .http_errors import internal_error, shutting_down
from .messages_output import MESSAGES_PATH, error_body

log = logging.getLogger("dflash2.serve")


class FaultGuard:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:  # the server quits now (a second Ctrl-C): uvicorn's
            if not started:  # answer would be a plain-text 500
                with contextlib.suppress(Exception):
                    await _answer(scope, receive, send, shutting_down(), 503)
            raise
        except Exception as exc:  # noqa: BLE001 - a server fault, reported, not propagated
            path = loggable(scope.get("path", ""), 200)
            log.error("%s %s failed", scope.get("method"), path, exc_info=exc)
            if not started:
                await _answer(scope, receive, send, internal_error(exc), 500)


async def _answer(scope, receive, send, err, status: int) -> None:
    """`err` as JSON, in Anthropic's shape on its path."""
    anthropic = str(scope.get("path", "")).startswith(MESSAGES_PATH)
    body = error_body(err) if anthropic else err.body()
    await JSONResponse(body, status_code=status)(scope, receive, send)
