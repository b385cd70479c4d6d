"""Chat messages of a request body, as the chat template takes them: roles, text content (a
string or text parts), tool calls and results in the history, participant names, thinking
(`reasoning_content`), and vLLM's continuation of a final assistant message."""

from __future__ import annotations

from .api_error import brief, invalid, optional
from .tools import history_tool_calls, tool_call_id


def add_piece(message: dict, key: str, text: str | None) -> None:
    """`text` added to `message[key]` (its content or reasoning_content) by join_pieces, once
    every turn is read: a join per piece copied the text so far each time (a body of 50,000
    consecutive turns took seconds of the server)."""
    message.setdefault("_" + key, [message.get(key)]).append(text)


def join_pieces(messages: list[dict], sep: str) -> None:
    """Each message's added pieces joined by `sep`, empty ones left out."""
    for message in messages:
        for key in ("content", "reasoning_content"):
            pieces = message.pop("_" + key, None)
            if pieces is not None:
                text = sep.join(t for t in pieces if t)
                if text or key == "content":
                    message[key] = text


def text_content(param: str, content, sep: str, refusal: bool = False) -> str:
    """A string, or a list of text parts joined with `sep` (with `refusal`, an assistant's
    refusal parts count as its text, as OpenAI's history holds them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, f"{param} must be a string or a list of text parts", "invalid_type")
    if not content:  # OpenAI's too: an array of at least one part
        raise invalid(param, f"{param} is an empty list: give a string or a text part")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if refusal and kind == "refusal" else "text" if kind == "text" else None
        if key is None:
            raise invalid(
                f"{param}[{j}]",
                'only text content parts ({"type": "text", "text": ...}) are supported'
                f"; got type {brief(kind)}",
                "unsupported_parameter",
            )
        if not isinstance(part.get(key), str):
            code = "missing_required_parameter" if part.get(key) is None else "invalid_type"
            raise invalid(f"{param}[{j}].{key}", f"{param}[{j}].{key} must be a string", code)
        texts.append(part[key])
    return sep.join(texts)


# Message fields besides role and content, by role.
_MESSAGE_FIELDS = {
    "system": ("name",),
    "developer": ("name",),
    "user": ("name",),
    # `reasoning`: vLLM's and OpenRouter's name for `reasoning_content`
    "assistant": ("name", "tool_calls", "reasoning_content", "reasoning", "refusal"),
    "tool": ("tool_call_id", "name"),
}
# A client's bookkeeping on any message, no instruction to the model: `id` (SDK dumps, chat
# UIs), LiteLLM's `provider_specific_fields` (copies of the message's own fields; its
# `reasoning` is the turn's reasoning where the message gives none).
_BOOKKEEPING = ("id", "provider_specific_fields")


def message(i: int, m) -> dict:
    """One message, as the chat template takes it."""
    if not isinstance(m, dict):
        raise invalid(f"messages[{i}]", "each message must be an object", "invalid_type")
    role = m.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_FIELDS:
        raise invalid(
            f"messages[{i}].role",
            f"role must be system, developer, user, assistant or tool; got {brief(role)}",
        )
    for k, v in m.items():
        if k in _BOOKKEEPING or k in ("role", "content", *_MESSAGE_FIELDS[role]):
            continue
        if v not in (None, []):
            raise invalid(
                f"messages[{i}].{k}",
                f"message field {brief(k)} is not supported"
                + (
                    f" on a {role} message"
                    if k in _MESSAGE_FIELDS["assistant"] + _MESSAGE_FIELDS["tool"]
                    else ""
                ),
                "unsupported_parameter",
            )
    calls = m.get("tool_calls") if role == "assistant" else None
    refusal = m.get("refusal") if role == "assistant" else None
    if refusal is not None and not isinstance(refusal, str):
        raise invalid(f"messages[{i}].refusal", "refusal must be a string", "invalid_type")
    if m.get("content") in (None, []) and (calls or refusal or role == "tool"):
        content = refusal or ""  # a turn that only calls tools, refused (its text), or empty
    elif "content" not in m:
        raise invalid(f"messages[{i}].content", "content is required", "missing_required_parameter")
    else:
        content = text_content(f"messages[{i}].content", m["content"], "\n", role == "assistant")
    # Chat templates know "system"; OpenAI's newer "developer" role means the same.
    out = {"role": "system" if role == "developer" else role, "content": content}
    if calls:
        out["tool_calls"] = history_tool_calls(i, calls)
    if role == "tool":
        out["tool_call_id"] = tool_call_id(i, m.get("tool_call_id"))
    for k in ("name", "reasoning_content", "reasoning"):
        if k in _MESSAGE_FIELDS[role] and m.get(k) is not None and (k, m[k]) != ("name", ""):
            if not isinstance(m[k], str):
                raise invalid(
                    f"messages[{i}].{k}", f"messages[{i}].{k} must be a string", "invalid_type"
                )
            out.setdefault("reasoning_content" if k == "reasoning" else k, m[k])
    kept = _kept_reasoning(i, m.get("provider_specific_fields"))
    if kept and role == "assistant" and "reasoning_content" not in out:
        out["reasoning_content"] = kept
    return out


def _kept_reasoning(i: int, fields) -> str | None:
    """The reasoning LiteLLM keeps in an assistant message's provider_specific_fields."""
    param = f"messages[{i}].provider_specific_fields"
    if fields in (None, []):  # empty, as other fields' [] is
        return None
    if not isinstance(fields, dict):
        raise invalid(param, f"{param} must be an object", "invalid_type")
    for k in ("reasoning_content", "reasoning"):
        value = fields.get(k)
        if value is not None and not isinstance(value, str):
            raise invalid(f"{param}.{k}", f"{param}.{k} must be a string", "invalid_type")
        if value:
            return value
    return None


def continuation(body: dict, messages: list[dict]) -> tuple[list[dict], str | None, bool]:
    """vLLM's `continue_final_message` (the reply continues the final assistant message, whose
    text becomes the reply's prefill) and `add_generation_prompt` (false: the prompt ends
    without an assistant header). Returns (messages, prefill, generation prompt)."""
    flag = lambda v: isinstance(v, bool)  # noqa: E731
    cont = optional(body, "continue_final_message", flag, "a boolean")
    header = optional(body, "add_generation_prompt", flag, "a boolean")
    if not cont:
        return messages, None, header is not False
    if header:
        raise invalid(
            "add_generation_prompt",
            "add_generation_prompt and continue_final_message cannot both be true",
        )
    last = messages[-1]
    if last["role"] != "assistant" or last.get("tool_calls"):
        raise invalid(
            f"messages[{len(messages) - 1}]",
            "continue_final_message: the final message must be an assistant message of text "
            "(no tool calls), which the reply continues",
        )
    if len(messages) == 1:
        raise invalid("messages", "a final assistant message to continue needs a message before it")
    return messages[:-1], last["content"], True
