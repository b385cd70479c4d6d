"""The Responses API's request (POST /v1/responses) as the chat request it amounts to.

Newer clients speak it by default (the OpenAI Agents SDK, Codex). Its `input` items become
chat messages (`instructions` a system message first; `function_call` items the assistant's
tool calls, `function_call_output` items tool messages), its function tools and `tool_choice`
the chat ones, `text.format` the chat `response_format`, `max_output_tokens` the token limit,
`reasoning.effort` the template's thinking switch, `reasoning` items the next assistant
turn's reasoning_content. The chat parser then checks everything as for /v1/chat/completions,
and its errors name the Responses field (responses_errors.py). Responses are not stored: `store: true`,
`previous_response_id`, `conversation` and `background` are refused; an `item_reference` names
one of this server's recent output items (response_items.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .api_error import APIError, brief, invalid
from .chat_messages import add_piece, join_pieces
from .response_items import RecentItems
from .responses_options import (
    apply_reasoning,
    apply_text_format,
    ChatTools,
    chat_tool_choice,
    chat_tools,
    wants_encrypted_reasoning,
)
from .responses_errors import THINKING_SWITCH, renamer
from .responses_output import unseal
from .schemas import GenRequest, check_token_limit, parse_chat
from .token_fields import ALIASES
from .unused_fields import OPENAI, check_unused

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
    "thinking_budget",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "repetition_context_size",
    "logit_bias",
    *ALIASES,  # repeat_penalty, as on chat
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
    "client_metadata",  # Codex's turn ids
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


def parse_responses(body: dict, recent: RecentItems | None = None) -> GenRequest:
    """The chat request a Responses body asks for; GenRequest.responses holds the fields
    its response echoes. `recent`: the server's recent output items, which `item_reference`
    inputs name."""
    if recent is not None and isinstance(body.get("input"), list):
        body = {**body, "input": recent.resolved(body["input"])}
    known = {*_SAME, *_HARMLESS, *_REFUSED, "input", "instructions", "max_output_tokens"}
    known |= {"tools", "tool_choice", "text", "reasoning", "include"}
    for name, value in body.items():
        if name in _REFUSED and not _REFUSED[name][0](value):
            raise invalid(
                name, f"{name}={brief(value)}: {_REFUSED[name][1]}", "unsupported_parameter"
            )
        if name not in known and value is not None:  # null asks nothing
            raise invalid(
                name, f"Unrecognized request argument supplied: {name[:60]}", "unknown_parameter"
            )
    check_unused(body, OPENAI)
    chat: dict[str, Any] = {k: body[k] for k in _SAME if k in body}
    tools = chat_tools(body["tools"]) if body.get("tools") is not None else ChatTools()
    messages, origin = _messages(body, tools)
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        check_token_limit(body, "max_output_tokens")
        chat["max_completion_tokens"] = body["max_output_tokens"]
    soft = tools.make_strict_by_default()
    if body.get("tools") is not None:
        chat["tools"] = tools.tools
        origin.update(tools.origin)
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = chat_tool_choice(body["tool_choice"], tools)
    apply_text_format(body.get("text"), chat)
    if apply_reasoning(body.get("reasoning"), chat):
        origin[THINKING_SWITCH] = "reasoning.effort"
    encrypted = wants_encrypted_reasoning(body.get("include"))
    try:
        req = parse_chat(chat)
    except APIError as err:
        raise renamer(origin)(err) from None
    if req.tools is not None and soft:
        req.tools = replace(req.tools, soft=req.tools.soft | soft)
    req.responses, req.rename = _echo(body), renamer(origin)
    req.encrypted_reasoning, req.tool_namespaces = encrypted, tools.called
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


def _messages(body: dict, tools: ChatTools) -> tuple[list[dict], dict[str, str]]:
    """The chat messages of `instructions` and `input`, and where each message (and each
    assistant tool call) came from: {"messages[k]" or "messages[k].tool_calls[j]": path}.
    Consecutive assistant items (text and calls) make one assistant turn, as generated;
    `instructions` and a leading system message make one system message."""
    messages: list[dict] = []
    origin: dict[str, str] = {}
    thought: list[str] = []  # reasoning items' text: the next assistant turn's reasoning_content

    def add(message: dict, where: str) -> None:
        origin[f"messages[{len(messages)}]"] = where
        messages.append(message)

    def think(message: dict) -> None:
        for text in thought:
            add_piece(message, "reasoning_content", text)
        thought.clear()

    instructions = _instructions(body)
    if instructions is not None:
        add({"role": "system", "content": instructions}, "instructions")
    for i, item in enumerate(_input_items(body.get("input"))):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "each input item must be an object", "invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        last = messages[-1] if messages else None
        if kind == "message":
            message = _message(where, item)
            role = message["role"]
            if role != "assistant":
                thought.clear()  # no answer followed that thinking
            if last is not None and (last["role"], role) == ("assistant", "assistant"):
                last["content"] = _flat(last["content"])
                add_piece(last, "content", _flat(message["content"]))
                think(last)
            elif len(messages) == 1 and instructions is not None and role in _SYSTEM:
                last["content"] = instructions + "\n\n" + _flat(message["content"])
            else:
                if role == "assistant":
                    think(message)
                add(message, where)
        elif kind == "function_call":
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                add(last, where)
            think(last)
            calls = last.setdefault("tool_calls", [])
            origin[f"messages[{len(messages) - 1}].tool_calls[{len(calls)}]"] = where
            calls.append(_call(where, item, tools))
        elif kind == "function_call_output":
            thought.clear()
            origin[f"messages[{len(messages)}]#kind"] = kind
            add(_call_output(where, item), where)
        elif kind == "reasoning":  # the thinking before an answer: templates render it or not
            thought.append(_thought(where, item))
        else:
            raise invalid(
                f"{where}.type",
                f"input items of type {brief(kind)} are not supported (message, function_call, "
                "function_call_output, reasoning)",
                "unsupported_parameter",
            )
    join_pieces(messages, "")
    return messages, origin


_SYSTEM = ("system", "developer")


def _instructions(body: dict) -> str | None:
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions", "instructions must be a string", "invalid_type")
    return instructions


def _input_items(items) -> list:
    """`input` as a list of items (a string is one user message)."""
    if items is None:
        raise invalid("input", "input is required", "missing_required_parameter")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise invalid("input", "input must be a string or a list of items", "invalid_type")
    return items


def _flat(content) -> str:
    """A message's text: a string, or its text parts joined (None: empty)."""
    if isinstance(content, list):
        return "".join(p["text"] for p in content)
    return content or ""


_MESSAGE_KEYS = ("type", "role", "content", "id", "status", "phase")  # phase: Codex's


def _message(where: str, item: dict) -> dict:
    for key, value in item.items():  # a Chat field (tool_calls, name) would be lost unsaid
        if key not in _MESSAGE_KEYS and value is not None:
            raise invalid(
                f"{where}.{key}",
                f"{where}.{key[:60]}: unknown field of a message item (a call is a "
                "function_call item of its own)",
                "unknown_parameter",
            )
    content = item.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise invalid(
            f"{where}.content",
            f"{where}.content must be a string or a list of parts",
            "invalid_type",
        )
    return {"role": item.get("role"), "content": _parts(f"{where}.content", content)}


def _thought(where: str, item: dict) -> str:
    """A reasoning item's thinking: its reasoning_text parts, else its encrypted_content (this
    server's, responses_output.seal), else its summary_text parts (this server's summary is
    the thinking whole; clients such as the Vercel AI SDK keep only the summary). Another
    server's sealed thinking (a conversation begun with OpenAI's models, then moved here)
    cannot be read: its summary stands for it (Codex resends the whole history each turn,
    so a refusal would end the conversation for good)."""
    content = item.get("content") or []
    if not isinstance(content, list):
        raise invalid(f"{where}.content", f"{where}.content must be a list", "invalid_type")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "reasoning_text":
            raise invalid(
                f"{where}.content[{j}]",
                "reasoning content parts must be reasoning_text",
                "invalid_type",
            )
        if not isinstance(part.get("text"), str):
            raise invalid(f"{where}.content[{j}].text", "text must be a string", "invalid_type")
        texts.append(part["text"])
    sealed = item.get("encrypted_content")
    if not texts and sealed is None:
        return _summary(where, item.get("summary"))
    if texts:
        return "".join(texts)
    text = unseal(sealed)
    return _summary(where, item.get("summary")) if text is None else text


def _summary(where: str, summary) -> str:
    if summary is None:
        return ""
    ok = isinstance(summary, list) and all(
        isinstance(p, dict) and p.get("type") == "summary_text" and isinstance(p.get("text"), str)
        for p in summary
    )
    if not ok:
        raise invalid(
            f"{where}.summary",
            f"{where}.summary must be a list of summary_text parts",
            "invalid_type",
        )
    return "\n\n".join(p["text"] for p in summary)


def _parts(where: str, content):
    """Text parts (input_text, output_text) as chat text parts and refusal parts as chat's
    (an assistant's only: chat's check); anything else as it is."""
    if not isinstance(content, list):
        return content
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "refusal"):
            raise invalid(
                f"{where}[{j}]",
                "only text parts (input_text, output_text) and an assistant's refusal parts "
                f"are supported; got type {brief(kind)}",
                "unsupported_parameter",
            )
        key = "refusal" if kind == "refusal" else "text"
        if not isinstance(part.get(key), str):
            code = "missing_required_parameter" if part.get(key) is None else "invalid_type"
            raise invalid(f"{where}[{j}].{key}", f"{where}[{j}].{key} must be a string", code)
        parts.append({"type": "refusal" if key == "refusal" else "text", key: part[key]})
    return parts


def _call(where: str, item: dict, tools: ChatTools) -> dict:
    for k in ("call_id", "name", "arguments"):
        if not isinstance(item.get(k), str):
            raise invalid(f"{where}.{k}", f"{k} must be a string", "invalid_type")
    name = tools.chat_name(item.get("namespace"), item["name"])  # as the model wrote it
    fn = {"name": name, "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": fn}


def _call_output(where: str, item: dict) -> dict:
    if not isinstance(item.get("call_id"), str):
        raise invalid(f"{where}.call_id", "call_id must be a string", "invalid_type")
    output = _parts(f"{where}.output", item.get("output"))
    if not isinstance(output, (str, list)):
        raise invalid(f"{where}.output", "output must be a string or text parts", "invalid_type")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}
