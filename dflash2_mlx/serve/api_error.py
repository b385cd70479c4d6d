"""The error every endpoint answers with: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import re

import reprlib

MAX_MESSAGE = 600  # characters of an error message; a bad value is quoted by `brief`
MAX_PARAM = 120

_brief = reprlib.Repr()
_brief.maxstring, _brief.maxother, _brief.maxlong = 60, 60, 40
_brief.maxlist = _brief.maxdict = _brief.maxtuple = 6


def brief(value) -> str:
    """repr(value), shortened: an error quotes the start of a bad value, never all 5 MB."""
    return _brief.repr(value)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def loggable(text, limit: int = 1000) -> str:
    """`text` fit for one log line: control characters a client sent (a %0a in a path, a
    newline in a field name, terminal escapes) written as escapes (\\n, \\x1b), at most
    `limit` characters: no client can forge or split a line of the server's log."""
    text = str(text)[:limit]
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class APIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
        details: dict | None = None,
    ):
        if len(message) > MAX_MESSAGE:  # whatever a message quotes, it stays short
            message = message[:MAX_MESSAGE] + "..."
        if param is not None and len(param) > MAX_PARAM:
            param = param[:MAX_PARAM] + "..."
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, self.code, self.headers = type, code, headers or {}
        self.details = details  # Anthropic's machine-readable `error.details`, where one applies

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def unknown_model(name: str, served: str) -> APIError:
    return APIError(
        404,
        f"The model {brief(name)} does not exist; this server serves {served!r}",
        param="model",
        code="model_not_found",
    )


def optional(body: dict, name: str, test, expected: str):
    """body[name] (None when absent or null), or a 400 naming it when `test` refuses it."""
    v = body.get(name)
    if v is not None and not test(v):
        raise invalid(name, f"{name} must be {expected}; got {brief(v)}", "invalid_type")
    return v


def renamed(err: APIError, param: str, renames=()) -> APIError:
    """`err` naming `param` (rewritten by `renames`: (regex, replacement) pairs), its message
    too: an error about a translated request names the field the client sent."""
    for pattern, repl in renames:
        param = re.sub(pattern, repl, param)
    if param == (err.param or ""):
        return err
    message = err.message.replace(err.param, param) if err.param else err.message
    return APIError(
        err.status,
        message,
        param=param,
        type=err.type,
        code=err.code,
        headers=err.headers,
        details=err.details,
    )


def not_typed_object(where: str, value) -> APIError:
    """The 400 for a string (or other value) sent where an object with a `type` belongs."""
    example = f'{{"type": "{value}"}}' if isinstance(value, str) else '{"type": ...}'
    return invalid(
        where, f"{where} must be an object, e.g. {example}; got {brief(value)}", "invalid_type"
    )


def check_object(value, where: str, keys: tuple[str, ...]) -> dict:
    """`value` if it is an object holding only `keys`, else a 400 naming `where` (or the
    first other key)."""
    if not isinstance(value, dict):
        raise invalid(where, f"{where} must be an object", "invalid_type")
    for k in value:
        if k not in keys:
            raise invalid(f"{where}.{k}", f"{where}.{k} is not supported", "unsupported_parameter")
    return value
