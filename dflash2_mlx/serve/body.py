"""Request bodies: read with a size limit (enforced while reading), parsed, checked for JSON
that Python accepts but nothing downstream can use (deep nesting, lone surrogates).

Every failure is a 4xx `APIError` naming what was wrong, without quoting the body; a client
that leaves mid-upload raises `ClientGone` (answered 499, counted, one log line).
"""

from __future__ import annotations

import asyncio
import json
import sys
import re

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from .http_errors import shutting_down
from .schemas import APIError

MAX_DEPTH = 64  # OpenAI bodies nest a few levels (tool schemas a dozen)
# After its first stall_s, a body must have come at least this fast on average (bytes/s): one
# trickled a byte at a time never stalls, yet would hold its buffer for as long as it likes.
MIN_BODY_RATE = 64 * 1024
# A body refused for coming too slowly closes its connection: kept open, the server would read
# (and drop) the rest first, as slowly. (A 413 does not: a client that sends its whole body
# before it reads, as Python's http.client, would meet a reset instead of the answer; a slow
# sender after one is cut by the next request head's deadline, serve/connections.py.)
CLOSE = {"Connection": "close"}
_SURROGATE = re.compile("[\ud800-\udfff]")


class ClientGone(Exception):
    """The client closed the connection before its request was read."""


def _invalid_json(message: str) -> APIError:
    return APIError(400, message, code="invalid_json")


async def read_body(
    request: Request, max_bytes: int, stall_s: float = 30.0, stop: asyncio.Event | None = None
) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `max_bytes` (a declared
    Content-Length before reading anything, else while the chunks arrive), with 408 when
    nothing of it arrives for `stall_s` seconds or it all has not come `stall_s` seconds plus
    its size (declared, else `max_bytes`) at MIN_BODY_RATE after the read began, and with 503
    when `stop` is set (the server shuts down: an upload still coming would hold the shutdown
    up to its stall timeout)."""
    too_large = APIError(
        413,
        f"the request body exceeds this server's limit of {max_bytes} bytes",
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    if size is not None and size > max_bytes:
        raise too_large
    loop = asyncio.get_running_loop()
    allowed = stall_s + (max_bytes if size is None else size) / MIN_BODY_RATE
    deadline = loop.time() + allowed
    body, chunks = bytearray(), request.stream().__aiter__()
    stopping = {asyncio.ensure_future(stop.wait())} if stop is not None else set()
    chunk = None
    try:
        while True:
            chunk = asyncio.ensure_future(chunks.__anext__())
            wait = min(stall_s, deadline - loop.time())
            done, _ = await asyncio.wait(
                {chunk, *stopping}, timeout=max(wait, 0.0), return_when="FIRST_COMPLETED"
            )
            if chunk not in done:
                if stop is not None and stop.is_set():
                    raise shutting_down()
                raise _too_slow(len(body), stall_s, allowed, loop.time() >= deadline)
            try:
                body += chunk.result()
            except StopAsyncIteration:
                return bytes(body)
            if len(body) > max_bytes:
                raise too_large
    except ClientDisconnect:
        raise ClientGone from None
    finally:  # what is still waiting goes with this read (a cancelled request's too)
        for waiter in (*stopping, chunk):
            if waiter is not None and not waiter.done():
                waiter.cancel()


def _too_slow(received: int, stall_s: float, allowed: float, late: bool) -> APIError:
    if late:
        why = f"came too slowly: {received} bytes in {allowed:.0f} s"
    else:
        why = f"stalled: nothing of it came for {stall_s:g} s"
    return APIError(408, f"the request body {why}", code="request_timeout", headers=CLOSE)


async def read_json(
    request: Request, max_bytes: int, stall_s: float = 30.0, stop: asyncio.Event | None = None
) -> dict:
    """The body as a JSON object: size-limited, parsed, free of lone surrogates."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):  # inflating would let a small upload pass the size limit
        raise APIError(
            415,
            f"Content-Encoding {encoding[:40]!r} is not supported: send the JSON body uncompressed",
            code="unsupported_content_encoding",
        )
    raw = await read_body(request, max_bytes, stall_s, stop)
    # off the event loop, as the request's parsing: a 4 MB body takes seconds to walk, and the
    # loop serves every other client (and the shutdown signal) meanwhile
    return await run_in_threadpool(parse_json, raw)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, free of deep nesting and lone surrogates."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise _invalid_json("could not parse the JSON body: it is nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # it names a position, not a value
        raise _invalid_json(f"could not parse the JSON body: {str(e)[:120]}") from None
    except ValueError:  # Python's limit on an int's digits, with advice for Python programmers
        raise _invalid_json(
            "could not parse the JSON body: a number in it has more than "
            f"{sys.get_int_max_str_digits()} digits"
        ) from None
    if not isinstance(body, dict):
        raise _invalid_json("the request body must be a JSON object")
    check_tree(body)
    return body


def check_tree(body) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings (keys included) holding a lone
    UTF-16 surrogate ("\\ud800": valid JSON, not valid Unicode: no tokenizer or encoder takes
    it). Iterative, so no depth can exhaust the stack; paths are spelled only for an error."""
    stack: list = [(body, None, 0)]  # (value, trail: (parent trail, key or index), depth)
    while stack:
        value, trail, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _invalid_json(f"the JSON body is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise _surrogate(_path(trail), "")
        elif isinstance(value, dict):
            for k, v in value.items():
                if _SURROGATE.search(k):
                    raise _surrogate(_path(trail), "a key in ")
                if isinstance(v, (str, dict, list)):
                    stack.append((v, (trail, k), depth + 1))
        elif isinstance(value, list):
            stack.extend(
                (v, (trail, i), depth + 1)
                for i, v in enumerate(value)
                if isinstance(v, (str, dict, list))
            )


def _path(trail) -> str:
    """messages[0].content, from a trail of keys and indices."""
    parts = []
    while trail is not None:
        trail, key = trail
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".")


def _surrogate(path: str, where: str) -> APIError:
    return APIError(
        400,
        f"{where}{path or 'the body'} holds a lone UTF-16 surrogate (an "
        "unpaired \\ud800-\\udfff escape): not valid Unicode",
        param=path or None,
        code="invalid_unicode",
    )
