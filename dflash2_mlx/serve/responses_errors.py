"""The Responses request's errors in its own words: the chat parser names chat fields
(`messages[2].content`, `tools[0].function.name`, `response_format`), which `renamer` maps back
to the Responses fields they came from (`input[3].output`, `tools[0].name`, `text.format`)."""

from __future__ import annotations

import re

from .api_error import APIError, renamed

_RENAMES = (
    (r"^messages$", "input"),
    (r"^tools\[(\d+)\]\.function\.", r"tools[\1]."),
    (r"^tool_choice\.function\.", "tool_choice."),
    (r"^response_format\.json_schema\b", "text.format"),
    (r"^response_format", "text.format"),
    (r"^max_completion_tokens", "max_output_tokens"),
)
THINKING_SWITCH = "chat_template_kwargs.enable_thinking"


def _renamed(err: APIError, origin: dict[str, str]) -> APIError:
    """An error about the chat request, naming the Responses field it came from."""
    param = err.param or ""
    tool = re.match(r"^(tools\[\d+\])(\.function)?(.*)$", param)
    if tool and tool.group(1) in origin:  # a function of a namespace has a path of its own
        param = origin[tool.group(1)] + tool.group(3)
    m = re.match(r"^messages\[(\d+)\](\.tool_calls\[(\d+)\])?(.*)$", param)
    if m:
        message, call, rest = f"messages[{m.group(1)}]", m.group(2), m.group(4)
        if call and message + call in origin:
            base = origin[message + call]
            rest = re.sub(r"^\.function\.", ".", rest).replace(".id", ".call_id", 1)
        elif rest == ".tool_calls" and message + ".tool_calls[0]" in origin:
            base, rest = origin[message + ".tool_calls[0]"], ""  # the calls: function_call items
        else:
            base = origin.get(message, "input")
            if call:
                rest = call + rest
        if base != "instructions" and rest.startswith((".tool_call_id", ".content")):
            if _is_output(origin, message):
                rest = rest.replace(".tool_call_id", ".call_id", 1).replace(
                    ".content", ".output", 1
                )
        param = base + rest
    if (
        param.startswith(THINKING_SWITCH) and THINKING_SWITCH in origin
    ):  # the switch reasoning.effort set
        param = origin[THINKING_SWITCH] + param[len(THINKING_SWITCH) :]
    err = renamed(err, param, _RENAMES)
    if err.code == "context_length_exceeded":  # its message names the prompt's field too
        message = err.message.replace("the messages", "the input")
        err = APIError(err.status, message, param=err.param, type=err.type, code=err.code)
    return err


def _is_output(origin: dict[str, str], message: str) -> bool:
    return origin.get(message + "#kind") == "function_call_output"


def renamer(origin: dict[str, str]):
    """Renames any APIError of this request to the Responses fields (handler errors too)."""
    return lambda err: _renamed(err, origin)
