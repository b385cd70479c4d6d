"""The server's own error responses: JSON in the API's shape (Anthropic's on /v1/messages),
logged as one line; a worker's failure as the error it means."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse

from ..errors import DFlash2Error
from .api_error import APIError, loggable
from .messages_output import MESSAGES_PATH, error_body
from .count_responses import CLIENT_GONE  # noqa: F401  (the handlers' import)
from .queue import ShuttingDown

log = logging.getLogger("dflash2.serve")


def error_response(err: APIError, request: Request | None = None) -> JSONResponse:
    """The JSON error, logged as one line (a client's mistake is not the server's; what it
    sent is escaped: `loggable`)."""
    where = ""
    if request is not None:
        where = f"{loggable(request.method, 20)} {loggable(request.url.path, 200)}: "
    anthropic = request is not None and request.url.path.startswith(MESSAGES_PATH)
    log.log(
        log_level(err.status),
        "%s%d %s: %s",
        where,
        err.status,
        err.code or err.type,
        loggable(err.message),
    )
    body = error_body(err) if anthropic else err.body()
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def log_level(status: int) -> int:
    """A fault is an error; a full queue or a shutdown a warning (the operator's to see at
    --log-level warning); a client's mistake information."""
    if status == 503:
        return logging.WARNING
    return logging.ERROR if status >= 500 else logging.INFO


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", type="server_error", code="shutting_down")


def internal_error(exc: BaseException) -> APIError:
    """A server fault: the type only (details, paths included, go to the server log)."""
    return APIError(
        500,
        f"internal error ({type(exc).__name__}); see the server log",
        type="server_error",
        code="internal_error",
    )


def from_worker(err: BaseException) -> APIError:
    if isinstance(err, ShuttingDown):
        return shutting_down()
    if isinstance(err, DFlash2Error):
        return APIError(400, str(err))
    return internal_error(err)
