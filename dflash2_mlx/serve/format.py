"""OpenAI response objects: completions, chunks, usage with the `dflash2` extension, SSE."""

from __future__ import annotations

import copy

import json
import time
import uuid

from dataclasses import dataclass

from ..engine.events import GenerationStats
from .reasoning import ThinkingStats
from .reply import Delta


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class ReplyStats:
    """What a chat reply held: tool calls, and the thinking section's share."""

    tool_calls: int
    thinking: ThinkingStats


def usage(
    prompt_tokens: int,
    stats: GenerationStats,
    block_size: int,
    speculative: bool,
    reply: ReplyStats | None = None,
) -> dict:
    """OpenAI usage plus `dflash2`: speculative decoding statistics of this request.

    rounds: draft-verify rounds (the prefill is not one); drafted / accepted: draft tokens
    proposed / kept by the target; tau: mean tokens committed per round, bonus included;
    lookup_rounds: rounds whose drafts came from context lookup rather than the drafter;
    datastore_rounds: rounds whose drafts came from the response datastore;
    grammar_rounds: rounds whose drafts were the text response_format's schema forces;
    block_size: tokens verified per round (anchor + drafts; 1 when speculative is off).
    completion_tokens_details: the request's `prediction` tokens that appeared in the
    completion (the answer followed them) / did not (OpenAI's Predicted Outputs fields).
    A chat reply (`reply`) adds completion_tokens_details.reasoning_tokens and, in `dflash2`,
    tool_calls and `reasoning`: the thinking section's tokens and the rounds that began in it
    (with their drafted / accepted tokens and tau).
    prompt_tokens_details.cached_tokens (and dflash2.cached_tokens): prompt tokens served by
    the prompt cache, not prefilled. batch_size / max_batch_size: mean / most requests verified
    together in its rounds (0 before any round); queue_wait_ms: from queued to its prefill.
    """
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": stats.committed,
        "total_tokens": prompt_tokens + stats.committed,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": stats.prediction_used,
            "rejected_prediction_tokens": stats.prediction_tokens - stats.prediction_used,
        },
        "dflash2": _engine_usage(stats, block_size, speculative),
    }
    if reply is not None:
        t = reply.thinking
        out["completion_tokens_details"]["reasoning_tokens"] = t.tokens
        out["dflash2"]["tool_calls"] = reply.tool_calls
        out["dflash2"]["reasoning"] = {
            "tokens": t.tokens,
            "rounds": t.rounds,
            "drafted": t.drafted,
            "accepted": t.accepted,
            "tau": round(t.tau, 4),
        }
    return out


def _engine_usage(stats: GenerationStats, block_size: int, speculative: bool) -> dict:
    """usage.dflash2: the request's rounds, acceptance, timings and batching."""
    return {
        "rounds": stats.rounds,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "tau": round(stats.tau, 4),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "lookup_rounds": stats.lookup_rounds,
        "datastore_rounds": stats.datastore_rounds,
        "grammar_rounds": stats.grammar_rounds,
        "block_size": block_size,
        "speculative": speculative,
        "cached_tokens": stats.reused_tokens,
        "prefill_ms": round(stats.prefill_ms, 3),
        "decode_ms": round(stats.decode_ms, 3),
        "decode_tokens_per_s": round(stats.decode_tps, 3),
        "batch_size": round(stats.mean_batch_size, 3),
        "max_batch_size": stats.max_batch_size,
        "queue_wait_ms": round(stats.queue_ms, 3),
    }


class Formatter:
    """Builds the objects of one response (one id, one creation time)."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.id = new_id(kind)
        self.created = int(time.time())
        self.index = 0  # the choice its objects carry

    def choice(self, index: int) -> "Formatter":
        """The same response's objects for choice `index` (`n` > 1)."""
        other = copy.copy(self)
        other.index = index
        return other

    def _head(self, obj: str) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def full(
        self,
        text: str,
        finish: str,
        usage_: dict,
        *,
        reasoning: str = "",
        tool_calls: list[dict] | None = None,
        logprobs: dict | None = None,
    ) -> dict:
        if self.kind == "chat":
            message = {
                "role": "assistant",
                "content": text or (None if tool_calls else text),
                "refusal": None,
            }
            if reasoning:  # under both names clients read (mlx_lm.server, vLLM: `reasoning`)
                message["reasoning_content"] = message["reasoning"] = reasoning
            if tool_calls:
                message["tool_calls"] = [
                    {k: v for k, v in c.items() if k != "index"} for c in tool_calls
                ]
            choice = {"index": self.index, "message": message}
            choice |= {"logprobs": logprobs, "finish_reason": finish}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage_}
        choice = {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage_}

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        *,
        role: bool = False,
        with_usage: bool = False,
        logprobs: dict | None = None,
    ) -> dict:
        if self.kind == "chat":
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": self.index, "delta": delta}
            choice |= {"logprobs": logprobs, "finish_reason": finish}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": self.index, "text": text or "", "logprobs": logprobs}
            choice["finish_reason"] = finish
            out = {**self._head("text_completion"), "choices": [choice]}
        if with_usage:
            out["usage"] = None
        return out

    def delta_chunk(self, delta: dict, *, with_usage: bool = False) -> dict:
        """A chat chunk carrying `delta` (reasoning_content, or tool_calls fragments)."""
        choice = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": None}
        out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, usage_: dict) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage_}


def delta_chunks(fmt: Formatter, deltas: list[Delta], with_usage: bool):
    """Chat chunks for a reply's deltas. A tool call goes out as the official client
    reassembles one: its index, id, type and name first, then its arguments."""
    for d in deltas:
        if d.kind == "content":
            yield fmt.chunk(d.text, with_usage=with_usage)
        elif d.kind == "reasoning":
            delta = {"reasoning_content": d.text, "reasoning": d.text}
            yield fmt.delta_chunk(delta, with_usage=with_usage)
        else:
            c = d.call
            head = {
                "index": c["index"],
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": ""},
            }
            yield fmt.delta_chunk({"tool_calls": [head]}, with_usage=with_usage)
            args = {"index": c["index"], "function": {"arguments": c["function"]["arguments"]}}
            yield fmt.delta_chunk({"tool_calls": [args]}, with_usage=with_usage)


class ChatStream:
    """A chat or completion stream's SSE lines, item by item (handler._stream drives it).
    `logprobs` puts the log-probabilities gathered so far on a chunk (logprobs.LogprobChunks)."""

    def __init__(
        self, fmt: Formatter, include_usage: bool, logprobs, closing: bool = True, tools=False
    ):
        self.fmt, self.with_usage, self.logprobs = fmt, include_usage, logprobs
        self.closing = closing  # False: one choice of several (no usage chunk, no [DONE])
        self.tools = tools  # the reply may be calls: the role chunk sets no content
        self.answered = False  # content or a call went out (else the end sends content "")

    def start(self, first):
        if self.fmt.kind == "chat":  # a reply of calls rebuilds to content null, as whole
            text = None if self.tools else ""
            yield sse(self.fmt.chunk(text, role=True, with_usage=self.with_usage))

    def echo(self, text: str):
        """A completion's echoed prompt, the first text of the stream."""
        self.logprobs.sent += len(text)
        yield sse(self.logprobs(self.fmt.chunk(text, with_usage=self.with_usage)))

    def item(self, item, reply):
        self.logprobs.add(item)
        if reply is not None:
            deltas = reply.feed(item.text, item.event)
            self.answered |= any(d.kind != "reasoning" for d in deltas)
            for chunk in delta_chunks(self.fmt, deltas, self.with_usage):
                yield sse(self.logprobs(chunk))
        elif item.text:
            yield sse(self.logprobs(self.fmt.chunk(item.text, with_usage=self.with_usage)))

    def error(self, err):
        yield sse(err.body())
        if self.closing:
            yield SSE_DONE

    def end(self, deltas: list[Delta], finish: str, usage_: dict):
        for chunk in delta_chunks(self.fmt, deltas, self.with_usage):
            yield sse(self.logprobs(chunk))
        self.answered |= any(d.kind != "reasoning" for d in deltas)
        if self.tools and not self.answered:
            # no text, no call: content "", as the whole reply's (the role chunk set none)
            yield sse(self.logprobs(self.fmt.chunk("", with_usage=self.with_usage)))
        text = None if self.fmt.kind == "chat" else ""
        yield sse(self.logprobs(self.fmt.chunk(text, finish, with_usage=self.with_usage)))
        if self.closing:
            yield from self.close(usage_)

    def close(self, usage_: dict):
        if self.with_usage:
            yield sse(self.fmt.usage_chunk(usage_))
        yield SSE_DONE
