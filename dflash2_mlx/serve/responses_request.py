"""The Responses API's request (POST /v1/responses) as the chat request it amounts to.

Newer clients speak it by default (the OpenAI Agents SDK, Codex). Its `input` items become
chat messages (`instructions` a system message first; `function_call` items the assistant's
tool calls, `function_call_output` items tool messages), its function tools and `tool_choice`
the chat ones, `text.format` the chat `response_format`, `max_output_tokens` the token limit,
`reasoning.effort` the template's thinking switch. The chat parser then checks everything as
for /v1/chat/completions, and its errors name the Responses field. Responses are not stored:
`store: true`, `previous_response_id`, `conversation`, `background` and item references are
refused.
"""

from __future__ import annotations

import re
from typing import Any

from .api_error import APIError, brief, invalid
from .schemas import GenRequest, parse_chat

# Responses field -> its chat field (the same meaning and checks).
_SAME = (
    "model",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "repetition_context_size",
    "logit_bias",
    "stream_options",
)
# Accepted and unused: they cannot change the generated text.
_HARMLESS = (
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "max_tool_calls",  # built-in tools only, which are not served
)
# field -> (allowed value test, why the others are refused)
_REFUSED = {
    "store": (lambda v: v in (None, False), "responses are not stored: send store false"),
    "previous_response_id": (
        lambda v: v is None,
        "responses are not stored: send the whole conversation in `input`",
    ),
    "conversation": (lambda v: v is None, "conversations are not stored"),
    "background": (lambda v: v in (None, False), "background responses are not supported"),
    "prompt": (lambda v: v is None, "stored prompts are not supported"),
    "truncation": (
        lambda v: v in (None, "disabled"),
        'only truncation "disabled" is supported (a prompt past the context is a 400)',
    ),
    "top_logprobs": (lambda v: v in (None, 0), "logprobs are not supported on /v1/responses"),
}
_THINKING = {"none": False, "minimal": False, "low": True, "medium": True, "high": True}
_THINKING["xhigh"] = True


def parse_responses(body: dict) -> GenRequest:
    """The chat request a Responses body asks for; GenRequest.responses holds the fields
    its response echoes."""
    known = {*_SAME, *_HARMLESS, *_REFUSED, "input", "instructions", "max_output_tokens"}
    known |= {"tools", "tool_choice", "text", "reasoning", "include"}
    for name, value in body.items():
        if name in _REFUSED and not _REFUSED[name][0](value):
            raise invalid(
                name, f"{name}={brief(value)}: {_REFUSED[name][1]}", "unsupported_parameter"
            )
        if name not in known:
            raise invalid(
                name, f"Unrecognized request argument supplied: {name[:60]}", "unknown_parameter"
            )
    chat: dict[str, Any] = {k: body[k] for k in _SAME if k in body}
    messages, origin = _messages(body)
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    _text(body.get("text"), chat)
    _reasoning(body.get("reasoning"), chat)
    _include(body.get("include"))
    try:
        req = parse_chat(chat)
    except APIError as err:
        raise _renamed(err, origin) from None
    req.responses = _echo(body)
    return req


def _echo(body: dict) -> dict:
    """The request fields a response object repeats, with the API's defaults."""
    text = body.get("text") or {}
    return {
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "max_output_tokens": body.get("max_output_tokens"),
        "text": {**text, "format": text.get("format") or {"type": "text"}},
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
    }


def _messages(body: dict) -> tuple[list[dict], list[str]]:
    """The chat messages of `instructions` and `input`, and each one's Responses path."""
    messages, origin = [], []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "instructions must be a string", "invalid_type")
        messages.append({"role": "system", "content": instructions})
        origin.append("instructions")
    items = body.get("input")
    if items is None:
        raise invalid("input", "input is required", "missing_required_parameter")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise invalid("input", "input must be a string or a list of items", "invalid_type")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "each input item must be an object", "invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(where, item))
        elif kind == "function_call":
            call = _call(where, item)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                continue  # one assistant turn with all its calls
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_call_output(where, item))
        elif kind == "reasoning":
            continue  # a past turn's thinking: templates drop it from the history
        else:
            raise invalid(
                f"{where}.type",
                f"input items of type {brief(kind)} are not supported (message, function_call, "
                "function_call_output, reasoning)",
                "unsupported_parameter",
            )
        origin.append(where)
    return messages, origin


def _message(where: str, item: dict) -> dict:
    role, content = item.get("role"), item.get("content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
                raise invalid(
                    f"{where}.content[{j}]",
                    "only text parts (input_text, output_text) are supported",
                    "unsupported_parameter",
                )
            parts.append({"type": "text", "text": part["text"]})
        content = parts
    return {"role": role, "content": content}


def _call(where: str, item: dict) -> dict:
    for k in ("call_id", "name", "arguments"):
        if not isinstance(item.get(k), str):
            raise invalid(f"{where}.{k}", f"{k} must be a string", "invalid_type")
    fn = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": fn}


def _call_output(where: str, item: dict) -> dict:
    if not isinstance(item.get("call_id"), str):
        raise invalid(f"{where}.call_id", "call_id must be a string", "invalid_type")
    output = item.get("output")
    if isinstance(output, list):
        output = _message(where, {"content": output})["content"]
    elif not isinstance(output, str):
        raise invalid(f"{where}.output", "output must be a string or text parts", "invalid_type")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _tools(tools) -> list:
    if not isinstance(tools, list):
        raise invalid("tools", "tools must be a list of tools", "invalid_type")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else t
            raise invalid(
                f"tools[{i}].type",
                f"only function tools are supported; got {brief(kind)}",
                "unsupported_parameter",
            )
        fn = {k: v for k, v in t.items() if k != "type"}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict):
        raise invalid(
            "tool_choice",
            f"tool_choice of type {brief(choice.get('type'))} is not supported",
            "unsupported_parameter",
        )
    return choice


def _text(text, chat: dict) -> None:
    """`text.format` as the chat `response_format`."""
    if text is None:
        return
    if not isinstance(text, dict):
        raise invalid("text", "text must be an object", "invalid_type")
    for k, v in text.items():
        if k == "verbosity" and v is not None:
            raise invalid("text.verbosity", "verbosity is not supported", "unsupported_parameter")
        if k not in ("format", "verbosity"):
            raise invalid(f"text.{k}", f"text.{k} is not supported", "unsupported_parameter")
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise invalid("text.format", "text.format must be an object", "invalid_type")
    if fmt.get("type") == "json_schema":
        inner = {k: v for k, v in fmt.items() if k != "type"}
        chat["response_format"] = {"type": "json_schema", "json_schema": inner}
    else:
        chat["response_format"] = fmt


def _reasoning(reasoning, chat: dict) -> None:
    """`reasoning.effort` as the template's thinking switch (enable_thinking)."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise invalid("reasoning", "reasoning must be an object", "invalid_type")
    effort = reasoning.get("effort")
    if effort is None:
        return
    if effort not in _THINKING:
        raise invalid("reasoning.effort", f"reasoning.effort must be one of {', '.join(_THINKING)}")
    kwargs = dict(chat.get("chat_template_kwargs") or {})
    kwargs.setdefault("enable_thinking", _THINKING[effort])
    chat["chat_template_kwargs"] = kwargs


def _include(include) -> None:
    if include is None:
        return
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise invalid("include", "include must be a list of strings", "invalid_type")
    if "message.output_text.logprobs" in include:
        raise invalid(
            "include", "logprobs are not supported on /v1/responses", "unsupported_parameter"
        )


_RENAMES = (
    (r"^tools\[(\d+)\]\.function\.", r"tools[\1]."),
    (r"^tool_choice\.function\.", "tool_choice."),
    (r"^response_format\.json_schema\b", "text.format"),
    (r"^response_format", "text.format"),
    (r"^max_completion_tokens", "max_output_tokens"),
    (r"^chat_template_kwargs\.enable_thinking", "reasoning.effort"),
)


def _renamed(err: APIError, origin: list[str]) -> APIError:
    """The chat parser's error, naming the Responses field it came from."""
    param = err.param or ""
    m = re.match(r"^messages\[(\d+)\]", param)
    if m:
        k = int(m.group(1))
        param = (origin[k] + param[m.end() :]) if k < len(origin) else "input"
    for pattern, repl in _RENAMES:
        param = re.sub(pattern, repl, param)
    if param == (err.param or ""):
        return err
    message = err.message.replace(err.param, param) if err.param else err.message
    return APIError(
        err.status, message, param=param, type=err.type, code=err.code, headers=err.headers
    )
