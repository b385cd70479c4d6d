"""Request fields that shape or report each token's distribution: the penalties and
logit_bias (mlx-lm's logits processors, engine/processors.py, as mlx_lm.server takes them)
and logprobs (engine/logprobs.py). Typed here; values are checked against the model when the
request's processors are built (handler)."""

from __future__ import annotations

from typing import Any

from ..engine.processors import check_penalty
from ..errors import ParameterError
from ..values import is_int, is_number
from .api_error import brief, invalid, optional

PENALTIES = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "repetition_context_size",
    "logit_bias",
)


# llama.cpp's, Ollama's and LM Studio's name (Open WebUI sends it): the same penalty
ALIASES = {"repeat_penalty": "repetition_penalty"}


def parse_penalties(body: dict) -> dict[str, Any]:
    """The penalty and logit_bias fields given (null: not given), typed; their values are
    checked against the model when its processors are built (processors.penalties). An
    alias's value is checked under the name it was sent by."""
    given = {}
    for alias, name in ALIASES.items():
        v, own = body.get(alias), body.get(name)
        if v is not None and own is not None and own != v:
            raise invalid(alias, f"{alias} and {name} disagree; send one")
    sent = [(n, n) for n in PENALTIES] + list(ALIASES.items())
    for field, name in sent:
        v = body.get(field)
        if v is None or name in given:
            continue
        if name == "logit_bias":
            if not isinstance(v, dict):
                raise invalid(name, "logit_bias must be an object", "invalid_type")
            # int() would also take "1_0", " 5", "+5" and other scripts' digits
            bad = next((k for k in v if not (k.isascii() and k.isdigit())), None)
            if bad is not None:
                raise invalid(name, f"logit_bias keys must be token ids; got {brief(bad)}")
            v = {int(k): w for k, w in v.items()}
        elif not (is_int(v) if name == "repetition_context_size" else is_number(v)):
            kind = "an integer" if name == "repetition_context_size" else "a number"
            raise invalid(field, f"{field} must be {kind}; got {brief(v)}", "invalid_type")
        elif field != name:  # its range now, named as sent (the handler checks by our name)
            try:
                check_penalty(name, v, 0)
            except ParameterError as e:
                raise invalid(field, str(e).replace(name, field, 1)) from None
        given[name] = v
    return given


MAX_TOP_LOGPROBS = {"chat": 20, "completion": 5}  # OpenAI's limits


def parse_logprobs(body: dict, kind: str) -> int | None:
    """Chat: `logprobs` (a boolean) and `top_logprobs`; completions: `logprobs` (the number of
    alternatives). Returns the alternatives per token, None when log-probabilities are off."""
    most = MAX_TOP_LOGPROBS[kind]
    if kind == "completion":
        v = optional(body, "logprobs", is_int, "an integer")
        if v is not None and not 0 <= v <= most:
            raise invalid("logprobs", f"logprobs must be in [0, {most}]; got {v}")
        return v
    on = optional(body, "logprobs", lambda v: isinstance(v, bool), "a boolean")
    top = optional(body, "top_logprobs", is_int, "an integer")
    if top is not None and not 0 <= top <= most:
        raise invalid("top_logprobs", f"top_logprobs must be in [0, {most}]; got {top}")
    if top and not on:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
    return (top or 0) if on else None
