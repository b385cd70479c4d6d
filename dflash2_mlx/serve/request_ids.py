"""The id of the request being served (its `x-request-id`). CountResponses sets it for the
request's task; the server's log lines name it, so an operator finds a request's lines from
the id a client saw."""

from __future__ import annotations

import logging
import uuid
from contextvars import ContextVar

REQUEST_ID: ContextVar[str] = ContextVar("dflash2_request_id", default="")


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


class NameRequests(logging.Filter):
    """Ends a line logged while a request is served with its id (lines of the worker thread
    name their job's request themselves: Job.name)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = REQUEST_ID.get()
        if rid and rid not in record.getMessage():
            record.msg, record.args = f"{record.getMessage()} ({rid})", None
        return True
