"""What one request may make the server do: body size, prompt / prediction / stop lengths.

Every bound is checked before the work it protects: the body size while it is read (before
parsing), lengths in characters before tokenizing (a bound that only refuses text that must
exceed the token limit), lengths in tokens before the request is queued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import defaults
from ..errors import DFlash2Error
from .schemas import APIError, GenRequest

MB = 1024 * 1024


@dataclass(frozen=True)
class ServeLimits:
    """Resolved once from the command line (cli/serve.py) and passed to `create_app`.

    max_body_bytes: a larger request body is refused with 413 while it is read.
    max_prompt_tokens / max_prediction_tokens: None = the context length allows.
    max_stop_chars: the longest stop string.
    shutdown_grace_s: after Ctrl-C, how long running generations may finish.
    keepalive_s: a stream still waiting for its first token (queue, prefill) after this long
    sends its headers, then an SSE comment every keepalive_s until the token comes (clients
    time out on silent connections; a non-streaming request cannot do that).
    body_stall_s: a request body that sends nothing for this long is refused with 408 (a
    stalled upload would hold its buffer, up to max_body_bytes, as long as it stays open); so
    is one slower on average than MIN_BODY_RATE after its first body_stall_s.
    head_s: a connection that has not sent a whole request head this long after it opened, or
    after its last response, is closed (serve/connections.py).
    """

    max_body_bytes: int = int(defaults.MAX_BODY_MB * MB)
    max_prompt_tokens: int | None = None
    max_prediction_tokens: int | None = None
    max_stop_chars: int = 1000
    shutdown_grace_s: float = defaults.SHUTDOWN_GRACE_S
    keepalive_s: float = 5.0
    body_stall_s: float = 30.0
    head_s: float = 30.0

    def __post_init__(self):
        for name in ("max_body_bytes", "max_stop_chars"):
            if getattr(self, name) < 1:
                raise DFlash2Error(f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("max_prompt_tokens", "max_prediction_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise DFlash2Error(f"{name} must be >= 1; got {v}")
        if not 0 <= self.shutdown_grace_s < math.inf:
            raise DFlash2Error(
                f"shutdown_grace_s must be >= 0 and finite; got {self.shutdown_grace_s}"
            )
        for name in ("keepalive_s", "body_stall_s", "head_s"):  # math.inf: no limit
            if not getattr(self, name) > 0:
                raise DFlash2Error(f"{name} must be > 0; got {getattr(self, name)}")


def longest_token_chars(tokenizer) -> int | None:
    """An upper bound on the characters one token covers (None: unknown). Vocabulary strings
    are at least as long as the text they decode to (byte-level and SentencePiece alike)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without HF's vocabulary accessor: no character bound
        return None
    return max((len(t) for t in vocab), default=None) or None


def _chars(value) -> int:
    """Characters in every string inside `value` (dicts' keys and values, lists)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _chars(v) for k, v in value.items() if isinstance(k, str))
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    return 0


class RequestLimits:
    """ServeLimits resolved against one server's tokenizer and context length."""

    def __init__(self, limits: ServeLimits, tokenizer, context: int):
        self.context = context
        self.prompt_tokens = min(limits.max_prompt_tokens or context - 1, context - 1)
        self.prediction_tokens = limits.max_prediction_tokens or context
        self.stop_chars = limits.max_stop_chars
        self.keepalive_s = limits.keepalive_s
        self.body_bytes = limits.max_body_bytes
        per_token = longest_token_chars(tokenizer)
        # Text longer than this holds more tokens than allowed, however it tokenizes.
        self.prompt_chars = per_token and per_token * self.prompt_tokens
        self.prediction_chars = per_token and per_token * self.prediction_tokens

    def check_text(self, req: GenRequest) -> None:
        """Before tokenizing: lengths in characters."""
        for i, s in enumerate(req.stop):
            if len(s) > self.stop_chars:
                raise _too_long(
                    f"stop[{i}]" if len(req.stop) > 1 else "stop",
                    f"a stop string has {len(s)} characters; the limit is {self.stop_chars}",
                )
        where = "messages" if req.kind == "chat" else "prompt"
        if req.kind == "chat":  # every string a template may render: names, calls, tools
            chars = _chars(req.messages or ()) + len(req.prefill or "")
            chars += _chars(req.tools.tools) if req.tools is not None else 0
        else:
            chars = len(req.prompt) if isinstance(req.prompt, str) else 0
            chars += len(req.suffix or "")
            if isinstance(req.prompt, list) and len(req.prompt) > self.prompt_tokens:
                raise self.prompt_error(req, where, len(req.prompt))
        if self.prompt_chars and chars > self.prompt_chars:
            raise self.prompt_error(req, where, self.prompt_tokens, chars)
        if self.prediction_chars and req.prediction and len(req.prediction) > self.prediction_chars:
            raise _too_long(
                "prediction",
                f"the prediction has {len(req.prediction)} characters: "
                f"more than {self.prediction_tokens} tokens, this server's limit",
            )

    def check_tokens(self, req: GenRequest, ids: list[int], predicted) -> None:
        """After tokenizing, before queueing: lengths in tokens."""
        if len(ids) > self.prompt_tokens:
            raise self.prompt_error(req, "messages" if req.kind == "chat" else "prompt", len(ids))
        if len(predicted) > self.prediction_tokens:
            raise _too_long(
                "prediction",
                f"the prediction has {len(predicted)} tokens; this "
                f"server's limit is {self.prediction_tokens}",
            )

    def prompt_error(
        self, req: GenRequest, where: str, n: int, chars: int | None = None
    ) -> APIError:
        """A prompt over the limit: the context's (in OpenAI's words, or Anthropic's for a
        Messages request), or --max-prompt-tokens.
        `chars`: refused by its length in characters (then it has more than `n` tokens)."""
        tokens = f"more than {n} tokens ({chars} characters)" if chars else f"{n} tokens"
        if self.prompt_tokens < self.context - 1:  # --max-prompt-tokens, in the same words
            if req.anthropic:
                return prompt_too_long(self.prompt_tokens + 1, tokens)
            return _too_long(
                where,
                f"This model's maximum context length is {self.prompt_tokens} tokens for a "
                f"prompt on this server (--max-prompt-tokens; the model's own context is "
                f"{self.context}). However, "
                f"your {where} resulted in {tokens}. Please reduce the length of the {where}.",
                "context_length_exceeded",
            )
        if req.anthropic:
            return prompt_too_long(self.context, tokens)
        return context_exceeded(self.context, where, tokens)


def _too_long(param: str, message: str, code: str = "too_long") -> APIError:
    return APIError(400, message, param=param, code=code)


def context_exceeded(
    context: int, where: str, prompt: int | str, completion: int = 0, param: str | None = None
) -> APIError:
    """OpenAI's (and vLLM's) context overflow error: code `context_length_exceeded` and the
    phrase "maximum context length is N tokens", which clients match to trim their history.
    where: "messages" | "prompt"; prompt: its tokens; completion: the max_tokens asked for
    (`param` names that field)."""
    if completion:
        asked = (
            f"you requested {prompt + completion} tokens ({prompt} in the {where}, "
            f"{completion} in the completion). Please reduce the length of the {where} "
            f"or {param}."
        )
    else:
        if isinstance(prompt, int):
            prompt = f"{prompt} tokens"
        asked = (
            f"your {where} resulted in {prompt}, and the completion needs at least one "
            f"more. Please reduce the length of the {where}."
        )
    message = f"This model's maximum context length is {context} tokens. However, {asked}"
    return APIError(400, message, param=param or where, code="context_length_exceeded")


def prompt_too_long(context: int, prompt: int | str) -> APIError:
    """Anthropic's wording of a prompt that leaves no room in the context (Messages API)."""
    tokens = f"{prompt} tokens" if isinstance(prompt, int) else prompt
    message = f"prompt is too long: {tokens} > {context - 1} maximum"
    return APIError(400, message, param=None, code="context_length_exceeded")
