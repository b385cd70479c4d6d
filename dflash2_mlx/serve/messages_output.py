"""A chat reply as an Anthropic Messages API message and its stream events.

Content blocks in the order generated: `thinking` (the reasoning), `text`, `tool_use` (one per
call, its arguments as `input`). `stop_reason`: `max_tokens` when cut (or
`model_context_window_exceeded` when the context's end cut it: a prompt + max_tokens past the
context generates up to the context, as Anthropic's newer models do), `tool_use` after calls,
`stop_sequence` (with `stop_sequence`) when one of the request's stop sequences ended it, else
`end_turn`. A stream sends `message_start`, each block's start / deltas / stop,
`message_delta` (the stop reason, output tokens) and `message_stop`.
"""

from __future__ import annotations

import json
import uuid

from .api_error import APIError
from .reply import Delta
from .responses_output import sse_event

MESSAGES_PATH = "/v1/messages"  # its errors take Anthropic's shape (error_body)
# HTTP status -> Anthropic's error type
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(err: APIError) -> dict:
    """Anthropic's error object (the field a 400 names leads its message)."""
    kind = _ERROR_TYPES.get(
        err.status, "api_error" if err.status >= 500 else "invalid_request_error"
    )
    message = (
        err.message if not err.param or err.param in err.message else f"{err.param}: {err.message}"
    )
    error = {"type": kind, "message": message}
    if err.details:
        error["details"] = err.details
    return {"type": "error", "error": error}


def usage(chat_usage: dict) -> dict:
    cached = chat_usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": chat_usage["prompt_tokens"] - cached,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": chat_usage["completion_tokens"],
        "dflash2": chat_usage["dflash2"],
    }


class MessageBuilder:
    """One message: its id, content blocks and events."""

    def __init__(self, model: str, stop_sequences: list[str], window: bool = False):
        self.id, self.model, self.stops = f"msg_{uuid.uuid4().hex}", model, stop_sequences
        self.window = window  # max_tokens was cut to the context's room: its end is the window's
        self.blocks: list[dict] = []
        self.open: dict | None = None  # the thinking or text block being streamed

    def message(self, stop_reason=None, stop_sequence=None, usage_=None) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": list(self.blocks),
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage_ or {"input_tokens": 0, "output_tokens": 0},
        }

    def whole(self, deltas: list[Delta], finish: str, stop: str | None, usage_: dict) -> dict:
        self.feed(deltas)
        self._close()
        return self.message(*self._stop(finish, stop), usage_)

    def start(self, input_tokens: int, cached: int) -> list[dict]:
        usage_ = {"input_tokens": input_tokens, "output_tokens": 0}
        usage_.update(cache_read_input_tokens=cached, cache_creation_input_tokens=0)
        return [{"type": "message_start", "message": self.message(usage_=usage_)}]

    def feed(self, deltas: list[Delta]) -> list[dict]:
        events = []
        for d in deltas:
            if d.kind == "tool_call":
                events += self._close() + self._tool_use(d.call)
            elif d.text:
                kind = "text" if d.kind == "content" else "thinking"
                if self.open is None or self.open["type"] != kind:
                    events += self._close() + self._start(kind)
                self.open[kind] += d.text
                delta = {"type": f"{kind}_delta", kind: d.text}
                events.append(
                    {"type": "content_block_delta", "index": len(self.blocks), "delta": delta}
                )
        return events

    def end(self, deltas: list[Delta], finish: str, stop: str | None, usage_: dict) -> list[dict]:
        events = self.feed(deltas) + self._close()
        reason, sequence = self._stop(finish, stop)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        return events + [  # the whole usage, as a whole message's (dflash2's statistics too)
            {"type": "message_delta", "delta": delta, "usage": dict(usage_)},
            {"type": "message_stop"},
        ]

    def _stop(self, finish: str, stop: str | None) -> tuple[str, str | None]:
        if finish == "length":  # cut, even after a call: the next one may be what was cut
            return ("model_context_window_exceeded" if self.window else "max_tokens"), None
        if any(b["type"] == "tool_use" for b in self.blocks):
            return "tool_use", None
        if stop is not None and stop in self.stops:
            return "stop_sequence", stop
        return "end_turn", None

    def _start(self, kind: str) -> list[dict]:
        self.open = (
            {"type": "text", "text": ""}
            if kind == "text"
            else {"type": "thinking", "thinking": "", "signature": ""}
        )
        block = {**self.open, kind: ""}
        return [{"type": "content_block_start", "index": len(self.blocks), "content_block": block}]

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        self.blocks.append(self.open)
        index, self.open = len(self.blocks) - 1, None
        stop = [{"type": "content_block_stop", "index": index}]
        if self.blocks[index]["type"] != "thinking":
            return stop
        # Anthropic ends a thinking block with its signature (this server signs nothing)
        sign = {"type": "signature_delta", "signature": ""}
        return [{"type": "content_block_delta", "index": index, "delta": sign}, *stop]

    def _tool_use(self, call: dict) -> list[dict]:
        fn = call["function"]
        arguments = json.loads(fn["arguments"])  # an object (reply.py keeps others as text)
        index = len(self.blocks)
        block = {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}}
        partial = json.dumps(arguments, ensure_ascii=False)
        self.blocks.append({**block, "input": arguments})
        return [
            {"type": "content_block_start", "index": index, "content_block": block},
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": partial},
            },
            {"type": "content_block_stop", "index": index},
        ]


class MessagesStream:
    """A /v1/messages stream's SSE lines, item by item (handler._stream drives it)."""

    def __init__(self, builder: MessageBuilder, input_tokens: int):
        self.builder, self.input_tokens, self.stop = builder, input_tokens, None

    def start(self, first):
        """`first`: the first queue item (its prefill event says what the cache served)."""
        cached = getattr(first.event, "reused_tokens", 0) or 0
        return map(sse_event, self.builder.start(self.input_tokens - cached, cached))

    def item(self, item, reply):
        self.stop = item.stop or self.stop
        return map(sse_event, self.builder.feed(reply.feed(item.text, item.event)))

    def error(self, err: APIError):
        return map(sse_event, [error_body(err)])

    def end(self, deltas: list[Delta], finish: str, usage_: dict):
        return map(sse_event, self.builder.end(deltas, finish, self.stop, usage(usage_)))
