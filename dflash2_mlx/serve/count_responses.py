"""ASGI middleware: every response counted in /metrics by endpoint and status, given its
request id, and logged in the access log when uvicorn would not (a client gone)."""

from __future__ import annotations

import logging

from .messages_output import MESSAGES_PATH
from .metrics import Metrics
from .request_ids import REQUEST_ID, new_request_id

CLIENT_GONE = 499  # nginx's "client closed request": counted in /metrics, never seen by anyone


class CountResponses:
    """ASGI middleware: counts every response by endpoint and status (streams included) and
    gives each its request id."""

    def __init__(self, app, metrics: Metrics, endpoints: tuple[str, ...]):
        self.app, self.metrics, self.endpoints = app, metrics, endpoints

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = next(
            (e for e in self.endpoints if path == e or path.startswith(e + "/")), "other"
        )

        # An id per response, where OpenAI's and Anthropic's SDKs read one (`_request_id`).
        rid = new_request_id()
        request_id = rid.encode()
        names = (b"x-request-id", b"request-id") if path.startswith(MESSAGES_PATH) else ()
        names = names or (b"x-request-id",)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.count_response(endpoint, message["status"])
                if message["status"] == CLIENT_GONE:  # uvicorn logs none: never sent
                    _log_access(scope, CLIENT_GONE)
                tags = [(name, request_id) for name in names]
                message = {**message, "headers": list(message.get("headers", [])) + tags}
            await send(message)

        token = REQUEST_ID.set(rid)  # for the log lines of this request's task
        try:
            return await self.app(scope, receive, counting_send)
        finally:
            REQUEST_ID.reset(token)


def _log_access(scope, status: int) -> None:
    """An access line as uvicorn's, for a response uvicorn does not log."""
    from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d',
        get_client_addr(scope),
        scope.get("method", ""),
        get_path_with_query_string(scope),
        scope.get("http_version", "1.1"),
        status,
    )
