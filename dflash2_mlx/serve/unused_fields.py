"""Request fields accepted and unused (they cannot change the text), checked for the type the
reference API gives them: a client's bug still gets the 400 OpenAI or Anthropic would send.
Enumerations (service tiers, cache retention) take any string: a newer client's value names
nothing here either."""

from __future__ import annotations

from typing import Any, Callable

from ..values import is_int, is_number
from .api_error import brief, invalid

Check = tuple[Callable[[Any], bool], str]  # (value test, what the value must be)


def _string(v) -> bool:
    return isinstance(v, str)


def _object(v) -> bool:
    return isinstance(v, dict)


_STRING: Check = (_string, "a string")
_OBJECT: Check = (_object, "an object")
OPENAI: dict[str, Check] = {
    "user": _STRING,
    "metadata": (
        lambda v: _object(v) and all(isinstance(x, str) for x in v.values()),
        "an object of string values",
    ),
    "service_tier": _STRING,
    "prompt_cache_key": _STRING,
    "prompt_cache_retention": _STRING,
    "safety_identifier": _STRING,
    "max_tool_calls": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "client_metadata": _OBJECT,
    # Ollama's: how long the model stays loaded, "5m" or seconds
    "keep_alive": (lambda v: _string(v) or is_number(v), "a duration string or a number"),
}
ANTHROPIC: dict[str, Check] = {
    "metadata": (
        lambda v: _object(v) and isinstance(v.get("user_id"), (str, type(None))),
        "an object whose user_id is a string",
    ),
    "service_tier": _STRING,
    "cache_control": _OBJECT,
    "inference_geo": _STRING,
    "speed": _STRING,
    "user_profile_id": _STRING,
    "workspace_id": _STRING,
}


def check_unused(body: dict, checks: dict[str, Check]) -> None:
    """A 400 naming the first unused field whose value has the wrong type (null: not sent)."""
    for name, (ok, what) in checks.items():
        value = body.get(name)
        if value is not None and not ok(value):
            raise invalid(name, f"{name} must be {what}; got {brief(value)}", "invalid_type")
