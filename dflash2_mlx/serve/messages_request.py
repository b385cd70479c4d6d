"""Anthropic's Messages API request (POST /v1/messages) as the chat request it amounts to.

For clients that speak Anthropic's API (its SDKs; tools pointed at a local server through
ANTHROPIC_BASE_URL). `system` becomes a system message (an empty one: none); content blocks become chat content:
`text` blocks the text (joined by newlines; consecutive same-role turns make one), an
assistant's `tool_use` blocks its tool calls, a user's `tool_result` blocks tool messages (in
order, before the user's own text); `thinking` blocks sent back are dropped (templates drop
past thinking); a final assistant message is the reply's prefill (chat's
`continue_final_message`). Tools (`input_schema`), `tool_choice`
(auto / any / tool / none, `disable_parallel_tool_use`), `stop_sequences`, `max_tokens`,
`temperature`, `top_p`, `top_k` (and this server's `min_p`, `seed`, penalties),
`output_config.format` (a JSON schema) and `thinking`
(enabled / adaptive / disabled: the template's thinking switch; `budget_tokens`: a thinking
budget, engine/budget.py) mean what the chat fields mean. The chat parser then checks
everything as for /v1/chat/completions, and errors name the Messages field.
"""

from __future__ import annotations

import json
import re

from .api_error import APIError, brief, check_object, invalid, renamed
from .chat_messages import add_piece, join_pieces
from .messages_options import apply_output_config, apply_thinking, apply_tool_choice, chat_tools
from .schemas import GenRequest, check_token_limit, parse_chat
from .token_fields import ALIASES, PENALTIES
from .unused_fields import ANTHROPIC, check_unused

_SAME = ("model", "stream", "temperature", "top_p", "top_k", "max_tokens")
# this server's additions, as on chat and Responses (an SDK's extra_body)
_SAME += ("min_p", "seed", *PENALTIES, *ALIASES)
# Accepted and unused: they cannot change the generated text (cache_control: this server's
# prompt cache works without hints).
_HARMLESS = (
    "metadata",
    "service_tier",
    "cache_control",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
    "diagnostics",
)
_NEUTRAL = {  # field -> allowed value test: others would change the output and are refused
    "mcp_servers": lambda v: v in (None, []),
    "container": lambda v: v is None,
    "context_management": lambda v: v is None or _clears_thinking_only(v),
}


# Server-held conversations (Threads): none here. The SDK's tool_runner asks for one by default
# and, told so in these words, sends the whole conversation from then on.
def _no_threads() -> APIError:
    return APIError(
        400,
        "thread: this server holds no conversations; send the whole conversation without "
        "`thread` (the SDK's tool_runner does so after this error, or pass thread=False)",
        param="thread",
        code="unsupported_parameter",
        details={"error_code": "thread_unsupported_request"},
    )


# generation's fields, not a count's (Anthropic's count_tokens refuses them)
_NOT_COUNTED = tuple(k for k in _SAME if k != "model") + ("stop_sequences",)
_NOT_COUNTED += ("metadata", "service_tier")


def parse_count_tokens(body: dict) -> GenRequest:
    """The prompt a count_tokens body asks to count (no generation fields)."""
    for name in _NOT_COUNTED:
        if name in body:
            raise invalid(name, f"{name}: Extra inputs are not permitted", "unknown_parameter")
    return parse_messages({**body, "max_tokens": 1})


def parse_messages(body: dict) -> GenRequest:
    """The chat request an Anthropic Messages body asks for (GenRequest.anthropic set)."""
    known = {*_SAME, *_HARMLESS, *_NEUTRAL, "messages", "system", "stop_sequences", "tools"}
    known |= {"tool_choice", "thinking", "output_config", "thread"}
    if body.get("thread") is not None:
        raise _no_threads()
    for name, value in body.items():
        if name not in known:
            raise invalid(name, f"{name}: Extra inputs are not permitted", "unknown_parameter")
        if name in _NEUTRAL and not _NEUTRAL[name](value):
            raise invalid(name, f"{name} is not supported", "unsupported_parameter")
    check_unused(body, ANTHROPIC)
    if body.get("max_tokens") is None:
        raise invalid("max_tokens", "max_tokens: Field required", "missing_required_parameter")
    check_token_limit(body, "max_tokens")
    chat = {k: body[k] for k in _SAME if k in body}
    chat["messages"], origin = _messages(body)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise invalid(
                "stop_sequences", "stop_sequences must be a list of strings", "invalid_type"
            )
        chat["stop"] = stops
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = chat_tools(tools)
    apply_tool_choice(body.get("tool_choice"), chat)
    budget = apply_thinking(body.get("thinking"), chat)
    apply_output_config(body.get("output_config"), chat)
    if chat["messages"] and chat["messages"][-1]["role"] == "assistant":
        _prefill(chat, len(body["messages"]) - 1)
    try:
        req = parse_chat(chat)
    except APIError as err:
        raise _renamed(err, origin) from None
    req.anthropic, req.rename = True, lambda err: _renamed(err, origin)
    req.thinking_budget = budget
    return req


def _messages(body: dict) -> tuple[list[dict], dict[str, str]]:
    messages: list[dict] = []
    origin: dict[str, str] = {}

    def add(message: dict, where: str) -> None:
        if not _joined(messages, message):
            origin[f"messages[{len(messages)}]"] = where
            messages.append(message)
        if message.get("tool_calls"):  # a joined turn's calls came from this message
            origin[f"messages[{len(messages) - 1}].tool_calls"] = where

    system = body.get("system")
    if system is not None and (text := _text("system", system)):
        add({"role": "system", "content": text}, "system")  # "" is none: the template's default
    items = body.get("messages")
    if not isinstance(items, list):
        kind = "missing_required_parameter" if items is None else "invalid_type"
        raise invalid("messages", "messages must be a list of messages", kind)
    if not items:
        raise invalid("messages", "messages: at least one message is required")
    for i, m in enumerate(items):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(where, "each message must be an object", "invalid_type")
        check_object(m, where, ("role", "content"))
        role, content = m.get("role"), m.get("content")
        _check_role(f"{where}.role", role)
        blank = content == [] or (isinstance(content, str) and not content.strip())
        if blank and not (role == "assistant" and i == len(items) - 1):
            raise invalid(
                f"{where}.content",
                f"{where}: all messages must have non-empty content except for the optional "
                "final assistant message",
            )
        if isinstance(content, str):
            add({"role": role, "content": content}, where)
            continue
        if not isinstance(content, list):
            raise invalid(f"{where}.content", "content must be a string or blocks", "invalid_type")
        parts: dict[str, list] = {"text": [], "call": [], "thought": []}
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind, value = _block(at, role, block)
            if kind == "result":
                origin[f"messages[{len(messages)}]#kind"] = "tool_result"
                add(value, at)
            elif kind is not None:
                parts[kind].append(value)
        texts, calls, thoughts = parts["text"], parts["call"], parts["thought"]
        if texts or calls or role == "assistant" or not content:  # roles keep alternating
            message = {"role": role, "content": "\n".join(texts) if texts else None}
            if thoughts:
                message["reasoning_content"] = "\n".join(thoughts)
            if calls:
                message["tool_calls"] = calls
            elif message["content"] is None:
                message["content"] = ""
            add(message, where)
    join_pieces(messages, "\n")
    return messages, origin


def _block(at: str, role: str, block) -> tuple[str | None, object]:
    """A content block as ("text", str), ("call", a chat tool call), ("result", a tool
    message), ("thought", str) or (None, None) for one skipped; others are a 400."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise invalid(f"{at}.text", f"{at}.text must be a string", "invalid_type")
        if not block["text"].strip():  # as Anthropic's API: a client bug, not an empty turn
            raise invalid(
                f"{at}.text", f"{at}: text content blocks must contain non-whitespace text"
            )
        return "text", block["text"]
    if kind == "tool_use" and role == "assistant":
        return "call", _call(at, block)
    if kind == "tool_result" and role == "user":
        return "result", _result(at, block)
    if kind == "thinking" and role == "assistant":
        # the turn's reasoning_content: the template keeps or drops it by its own rule (Qwen's
        # keeps the current turn's, across its tool calls)
        if not isinstance(block.get("thinking"), str):
            raise invalid(f"{at}.thinking", f"{at}.thinking must be a string", "invalid_type")
        return "thought", block["thinking"]
    if kind == "redacted_thinking" and role == "assistant":
        return None, None  # sealed by another server: nothing to read
    raise invalid(
        f"{at}.type",
        f"{role} content blocks of type {brief(kind)} are not supported (text, "
        + ("tool_use, thinking)" if role == "assistant" else "tool_result)"),
        "unsupported_parameter",
    )


def _joined(messages: list[dict], message: dict) -> bool:
    """Joins `message` to the last of `messages` when both are user (or assistant) turns, the
    earlier with no tool calls, as Anthropic combines consecutive turns; whether it did."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != message["role"] or last.get("tool_calls"):
        return False
    if message["role"] not in ("user", "assistant"):
        return False
    for key in ("content", "reasoning_content"):
        add_piece(last, key, message.get(key))
    if message.get("tool_calls"):
        last["tool_calls"] = message["tool_calls"]
    return True


def _text(where: str, value) -> str:
    """A string, or text blocks joined by newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in value
    ):
        return "\n".join(b["text"] for b in value)
    raise invalid(where, f"{where} must be a string or text blocks", "invalid_type")


def _call(where: str, block: dict) -> dict:
    for k in ("id", "name"):
        if not isinstance(block.get(k), str):
            raise invalid(f"{where}.{k}", f"{k} must be a string", "invalid_type")
    if not isinstance(block.get("input"), dict):
        raise invalid(f"{where}.input", "input must be an object", "invalid_type")
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def _result(where: str, block: dict) -> dict:
    if not isinstance(block.get("tool_use_id"), str):
        raise invalid(f"{where}.tool_use_id", "tool_use_id must be a string", "invalid_type")
    content = block.get("content", "")
    text = _text(f"{where}.content", content)
    if block.get("is_error"):
        text = f"Error: {text}"  # what the tool said, marked as a failure
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _check_role(where: str, role) -> None:
    if role == "system":  # Anthropic's words: Claude Code then moves it into a user turn
        raise invalid(
            where,
            'messages: Unexpected role "system". The Messages API accepts a top-level '
            '`system` parameter, not "system" as an input message role.',
        )
    if role not in ("user", "assistant") or not isinstance(role, str):
        raise invalid(where, f"role must be user or assistant; got {brief(role)}")


def _prefill(chat: dict, last: int) -> None:
    """A final assistant message: the reply continues its text (Anthropic's prefill)."""
    where, text = f"messages[{last}]", chat["messages"][-1]["content"] or ""
    if text != text.rstrip():
        raise invalid(where, "final assistant content cannot end with trailing whitespace")
    if chat.get("chat_template_kwargs", {}).get("enable_thinking"):
        raise invalid(
            where,
            "a final assistant message to continue cannot go with thinking",
            "unsupported_parameter",
        )
    chat["continue_final_message"] = True


def _clears_thinking_only(value) -> bool:
    """context_management that only clears past thinking (Claude Code's): the template renders
    past thinking by its own rule (Qwen's keeps the current turn's), and nothing else changes."""
    edits = value.get("edits") if isinstance(value, dict) and len(value) == 1 else None
    return isinstance(edits, list) and all(
        isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking_") for e in edits
    )


_RENAMES = (
    (r"^response_format\.json_schema\b", "output_config.format"),
    (r"^response_format", "output_config.format"),
    (r"^max_completion_tokens", "max_tokens"),
    (r"^stop\b", "stop_sequences"),
    (r"^tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema"),
    (r"^tools\[(\d+)\]\.function\.", r"tools[\1]."),
    (r"^tool_choice\.function\.", "tool_choice."),
    (r"^thinking_budget", "thinking.budget_tokens"),
)


def _renamed(err: APIError, origin: dict[str, str]) -> APIError:
    """An error about the chat request, naming the Messages field it came from."""
    param = err.param or ""
    m = re.match(r"^messages\[(\d+)\](.*)$", param)
    if m:
        key = f"messages[{m.group(1)}]"
        rest = m.group(2)
        if origin.get(key + "#kind") == "tool_result":
            rest = rest.replace(".tool_call_id", ".tool_use_id", 1)
        if rest == ".tool_calls":  # the calls: tool_use blocks of the message that sent them
            key, rest = key + ".tool_calls", ".content"
        param = origin.get(key, "messages") + rest
    if param == "chat_template_kwargs.enable_thinking":  # set by `thinking`
        param = "thinking.type"
    return renamed(err, param, _RENAMES)
