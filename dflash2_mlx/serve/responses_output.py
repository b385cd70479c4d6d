"""A chat reply as the Responses API's response object and its semantic stream events.

The output items are the reply's reasoning (a `reasoning` item with its text), its content (a
`message` with one `output_text` part) and its tool calls (`function_call` items), in the
order they were generated. A stream announces each item, sends its text or arguments as
deltas and closes it, then ends with `response.completed` (or `response.incomplete` when
max_output_tokens cut it) carrying the whole response; every event has a sequence number and
there is no `[DONE]`.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from typing import Callable

from .reply import Delta


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


_SEALED = "dflash2:"  # encrypted_content: the thinking's text, base64 (opaque, not secret)


def seal(text: str) -> str:
    return _SEALED + base64.b64encode(text.encode()).decode()


def unseal(value) -> str | None:
    """The text seal() sealed in `value`, or None if this server did not seal it."""
    if not isinstance(value, str) or not value.startswith(_SEALED):
        return None
    try:
        return base64.b64decode(value[len(_SEALED) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def sse_event(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def usage(chat_usage: dict) -> dict:
    """The chat usage object in the Responses API's names (its dflash2 block kept)."""
    details = chat_usage.get("completion_tokens_details", {})
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
        "total_tokens": chat_usage["total_tokens"],
        "dflash2": chat_usage["dflash2"],
    }


class ResponseBuilder:
    """One response: its id, the fields it echoes, its output items and its event sequence."""

    def __init__(
        self,
        model: str,
        echo: dict,
        encrypted_reasoning: bool = False,
        namespaces: dict[str, tuple[str, str]] | None = None,
        keep: Callable[[dict], None] | None = None,
    ):
        self.id, self.created = _id("resp"), int(time.time())
        self.keep = keep  # told each finished item (response_items: item_reference targets)
        self.model, self.echo = model, echo
        self.encrypted = encrypted_reasoning  # reasoning items carry encrypted_content
        # a namespaced function's chat name -> (its namespace, its name there)
        self.namespaces = namespaces or {}
        # A summary asked for is the thinking, whole, also as the item's summary_text (the
        # part Codex and the Agents SDK show): no separate summarizer runs.
        asked = echo.get("reasoning") or {}
        self.summary = (asked.get("summary") or asked.get("generate_summary")) is not None
        self.output: list[dict] = []  # finished items
        self.item: dict | None = None  # the reasoning or message item being streamed
        self.text = ""  # the streamed item's text so far
        self.seq = 0

    # ------------------------------------------------------------------ whole
    def response(self, status: str, usage_: dict | None = None) -> dict:
        out = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "model": self.model,
            "output": list(self.output),
            "usage": usage_,
            "store": False,
            **self.echo,
        }
        if status == "completed":
            out["completed_at"] = int(time.time())
        return out

    def whole(self, deltas: list[Delta], finish: str, usage_: dict) -> dict:
        """The finished response from all of the reply's deltas."""
        self.feed(deltas)  # builds the items (the events are not sent)
        return self._end(finish, usage_)[-1]["response"]

    def _finished(self, item: dict) -> None:
        self.output.append(item)
        if self.keep is not None:
            self.keep(item)

    # ------------------------------------------------------------------ stream
    def start(self) -> list[dict]:
        return [
            self._event("response.created", response=self.response("in_progress")),
            self._event("response.in_progress", response=self.response("in_progress")),
        ]

    def feed(self, deltas: list[Delta]) -> list[dict]:
        events: list[dict] = []
        for d in deltas:
            if d.kind == "tool_call":
                events += self._close() + self._call(d.call)
                continue
            if not d.text:
                continue
            kind = "message" if d.kind == "content" else "reasoning"
            if self.item is None or self.item["type"] != kind:
                events += self._close() + self._open(kind)
            events += self._text_deltas(d.text)
        return events

    def end(self, deltas: list[Delta], finish: str, usage_: dict) -> list[dict]:
        """The reply's last deltas, then the closing events and the finished response."""
        return self.feed(deltas) + self._end(finish, usage_)

    def error(self, code: str | None, message: str, param: str | None) -> list[dict]:
        """A reply that failed midway: the `error` event, then the terminal `response.failed`
        that stream consumers wait on (the SDKs' final-response helpers among them)."""
        failed = self.response("failed")
        failed["error"] = {"code": "server_error", "message": message}
        return [
            self._event("error", code=code, message=message, param=param),
            self._event("response.failed", response=failed),
        ]

    # ------------------------------------------------------------------ items
    def _end(self, finish: str, usage_: dict) -> list[dict]:
        status = "incomplete" if finish == "length" else "completed"
        events = self._close(status)
        answered = any(i["type"] in ("message", "function_call") for i in self.output)
        if not answered and status == "completed":  # an empty answer (a cut one: none yet)
            events += self._open("message") + self._close(status)
        name = "response.incomplete" if status == "incomplete" else "response.completed"
        return events + [self._event(name, response=self.response(status, usage_))]

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _where(self) -> dict:
        return {"item_id": self.item["id"], "output_index": len(self.output)}

    def _open(self, kind: str) -> list[dict]:
        if kind == "message":
            self.item = {"id": _id("msg"), "type": "message", "role": "assistant", "content": []}
        else:
            self.item = {"id": _id("rs"), "type": "reasoning", "summary": [], "content": []}
        self.item["status"] = "in_progress"
        self.text = ""
        events = [
            self._event(
                "response.output_item.added", item=dict(self.item), output_index=len(self.output)
            )
        ]
        # a reasoning item's text part is announced too: the Node SDK's stream accumulator
        # makes content[0] only from this event
        part = (
            {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            if kind == "message"
            else {"type": "reasoning_text", "text": ""}
        )
        events.append(
            self._event("response.content_part.added", **self._where(), content_index=0, part=part)
        )
        if kind == "reasoning" and self.summary:
            part = {"type": "summary_text", "text": ""}
            events.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    **self._where(),
                    summary_index=0,
                    part=part,
                )
            )
        return events

    def _text_deltas(self, text: str) -> list[dict]:
        self.text += text
        if self.item["type"] == "message":
            return [
                self._event(
                    "response.output_text.delta",
                    **self._where(),
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            ]
        where = self._where()
        events = [
            self._event("response.reasoning_text.delta", **where, content_index=0, delta=text)
        ]
        if self.summary:
            events.append(
                self._event(
                    "response.reasoning_summary_text.delta", **where, summary_index=0, delta=text
                )
            )
        return events

    def _close(self, status: str = "completed") -> list[dict]:
        if self.item is None:
            return []
        where, events = self._where(), []
        if self.item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            events.append(
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=self.text,
                    logprobs=[],
                )
            )
        else:
            part = {"type": "reasoning_text", "text": self.text}
            events.append(
                self._event(
                    "response.reasoning_text.done", **where, content_index=0, text=self.text
                )
            )
        events.append(
            self._event("response.content_part.done", **where, content_index=0, part=part)
        )
        if self.item["type"] == "reasoning":
            events += self._summary_done(where)
        item = {**self.item, "content": [part], "status": status}
        if self.item["type"] == "reasoning" and self.summary:
            item["summary"] = [{"type": "summary_text", "text": self.text}]
        if self.item["type"] == "reasoning" and self.encrypted:
            item["encrypted_content"] = seal(self.text)
        events.append(
            self._event("response.output_item.done", item=item, output_index=where["output_index"])
        )
        self._finished(item)
        self.item = None
        return events

    def _summary_done(self, where: dict) -> list[dict]:
        """The reasoning item's summary part closing (when a summary was asked for)."""
        if not self.summary:
            return []
        part = {"type": "summary_text", "text": self.text}
        return [
            self._event(
                "response.reasoning_summary_text.done", **where, summary_index=0, text=self.text
            ),
            self._event(
                "response.reasoning_summary_part.done", **where, summary_index=0, part=part
            ),
        ]

    def _call(self, call: dict) -> list[dict]:
        fn = call["function"]
        item = {
            "id": _id("fc"),
            "type": "function_call",
            "call_id": call["id"],
            "name": fn["name"],
            "arguments": "",
            "status": "in_progress",
        }
        if fn["name"] in self.namespaces:
            item["namespace"], item["name"] = self.namespaces[fn["name"]]
        index = len(self.output)
        where = {"item_id": item["id"], "output_index": index}
        done = {**item, "arguments": fn["arguments"], "status": "completed"}
        events = [
            self._event("response.output_item.added", item=item, output_index=index),
            self._event("response.function_call_arguments.delta", **where, delta=fn["arguments"]),
            self._event(
                "response.function_call_arguments.done",
                **where,
                arguments=fn["arguments"],
                name=item["name"],
            ),
            self._event("response.output_item.done", item=done, output_index=index),
        ]
        self._finished(done)
        return events


class ResponsesStream:
    """A /v1/responses stream's SSE lines, item by item (handler._stream drives it)."""

    def __init__(self, builder: ResponseBuilder):
        self.builder = builder

    def start(self, first):
        return map(sse_event, self.builder.start())

    def item(self, item, reply):
        return map(sse_event, self.builder.feed(reply.feed(item.text, item.event)))

    def error(self, err):
        return map(sse_event, self.builder.error(err.code, err.message, err.param))

    def end(self, deltas: list[Delta], finish: str, usage_: dict):
        return map(sse_event, self.builder.end(deltas, finish, usage(usage_)))
