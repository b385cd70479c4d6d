"""OpenAI response objects: completions, chunks, usage with the `dflash2` extension, SSE."""

from __future__ import annotations

import json
import time
import uuid

from ..engine.events import GenerationStats


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def usage(prompt_tokens: int, stats: GenerationStats, block_size: int, speculative: bool) -> dict:
    """OpenAI usage plus `dflash2`: speculative decoding statistics of this request.

    rounds: draft-verify rounds (the prefill is not one); drafted / accepted: draft tokens
    proposed / kept by the target; tau: mean tokens committed per round, bonus included;
    lookup_rounds: rounds whose drafts came from context lookup rather than the drafter;
    block_size: tokens verified per round (anchor + drafts; 1 when speculative is off).
    completion_tokens_details counts the draft tokens taken from the request's `prediction`
    that the target accepted / rejected (OpenAI's Predicted Outputs fields).
    prompt_tokens_details.cached_tokens (and dflash2.cached_tokens): prompt tokens served by
    the prompt cache, not prefilled.
    """
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": stats.committed,
        "total_tokens": prompt_tokens + stats.committed,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": stats.prediction_accepted,
            "rejected_prediction_tokens": stats.prediction_drafted - stats.prediction_accepted,
        },
        "dflash2": {
            "rounds": stats.rounds,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "tau": round(stats.tau, 4),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "lookup_rounds": stats.lookup_rounds,
            "block_size": block_size,
            "speculative": speculative,
            "cached_tokens": stats.reused_tokens,
            "prefill_ms": round(stats.prefill_ms, 3),
            "decode_ms": round(stats.decode_ms, 3),
            "decode_tokens_per_s": round(stats.decode_tps, 3),
        },
    }


class Formatter:
    """Builds the objects of one response (one id, one creation time)."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.id = new_id(kind)
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def full(self, text: str, finish: str, usage_: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                              "refusal": None},
                      "logprobs": None, "finish_reason": finish}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage_}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage_}

    def chunk(self, text: str | None, finish: str | None = None, *, role: bool = False,
              with_usage: bool = False) -> dict:
        if self.kind == "chat":
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            out = {**self._head("text_completion"), "choices": [choice]}
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, usage_: dict) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage_}
