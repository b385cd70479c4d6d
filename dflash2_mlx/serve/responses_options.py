"""The Responses API's request options as the chat request's: function `tools` and
`tool_choice`, `text.format` (the chat `response_format`), `reasoning` (the thinking switch)
and `include` (responses_request.py uses them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .api_error import brief, check_object, invalid
from .reasoning import with_effort


# Tools that OpenAI's servers run (web search, files, code, images): none runs here.
HOSTED = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation")


@dataclass
class ChatTools:
    """Responses `tools` as chat tools: a namespace's function tools join the list (the
    model calls them by name; `namespace__name` where another tool has that name).
    `origin` names each chat tool's Responses field; `names` maps (namespace or None, name)
    to the chat name, `called` the chat names of namespaced functions back."""

    tools: list = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # "tools[j]" -> "tools[i].tools[k]"
    names: dict[tuple[str | None, str], str] = field(default_factory=dict)
    called: dict[str, tuple[str, str]] = field(default_factory=dict)  # chat -> (ns, name)

    def make_strict_by_default(self) -> frozenset[str]:
        """The functions that leave `strict` out made strict, as the Responses API's default
        is; their chat names (ToolRequest.soft: held to their schema where that can be)."""
        names = []
        for t in self.tools:
            if t["function"].get("strict") is None:
                t["function"]["strict"] = True
                names.append(t["function"]["name"])
        return frozenset(names)

    def chat_name(self, namespace, name: str) -> str:
        """The chat name of a call a client sends back (its `namespace` as it came)."""
        return self.names.get((namespace, name), name)


def chat_tools(tools) -> ChatTools:
    if not isinstance(tools, list):
        raise invalid("tools", "tools must be a list of tools", "invalid_type")
    out = ChatTools()
    raw = Counter(_raw_names(tools))
    for i, t in enumerate(tools):
        if isinstance(t, dict) and t.get("type") == "namespace":
            _add_namespace(out, t, f"tools[{i}]", raw)
        else:
            _add_function(out, t, f"tools[{i}]")
    return out


def _raw_names(tools: list):
    for t in tools:
        inner = t.get("tools") if isinstance(t, dict) and t.get("type") == "namespace" else [t]
        for f in inner if isinstance(inner, list) else ():
            if isinstance(f, dict) and isinstance(f.get("name"), str):
                yield f["name"]


def _add_namespace(out: ChatTools, ns: dict, where: str, raw: Counter) -> None:
    name, inner = ns.get("name"), ns.get("tools")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name", "a namespace needs a name", "invalid_type")
    if not isinstance(inner, list):
        raise invalid(f"{where}.tools", "a namespace's tools must be a list", "invalid_type")
    for k, t in enumerate(inner):
        fn = _add_function(out, t, f"{where}.tools[{k}]")
        given = fn.get("name")
        if isinstance(given, str):
            chat = f"{name}__{given}" if raw[given] > 1 else given  # two MCP servers' `search`
            fn["name"], out.names[(name, given)], out.called[chat] = chat, chat, (name, given)


def _add_function(out: ChatTools, t, where: str) -> dict:
    if not isinstance(t, dict) or t.get("type") != "function":
        kind = t.get("type") if isinstance(t, dict) else t
        why = f"only function tools (and namespaces of them) are supported; got {brief(kind)}"
        if kind in HOSTED:
            why += f": {kind} runs on OpenAI's servers, and none runs here"
        if kind == "web_search":
            why += ' (Codex: web_search = "disabled" in its config.toml)'
        raise invalid(f"{where}.type", why, "unsupported_parameter")
    if "function" in t and "name" not in t:  # a chat completions tool, sent here
        raise invalid(
            f"{where}.function",
            'a Responses tool is flat: {"type": "function", "name": ..., "parameters": ...} '
            '(the chat completions shape nests them in "function")',
            "invalid_value",
        )
    # the chat order (templates render the keys as they come)
    order = ("name", "description", "parameters", "strict")
    fn = {k: t[k] for k in order if k in t}
    fn.update((k, v) for k, v in t.items() if k not in order and k != "type")
    out.origin[f"tools[{len(out.tools)}]"] = where
    out.tools.append({"type": "function", "function": fn})
    return fn


def chat_tool_choice(choice, tools: ChatTools):
    if isinstance(choice, dict) and choice.get("type") == "function":
        if "function" in choice and "name" not in choice:  # the chat completions shape
            raise invalid(
                "tool_choice.function",
                'a Responses tool_choice is flat: {"type": "function", "name": ...} (the '
                'chat completions shape nests the name in "function")',
                "invalid_value",
            )
        name = choice.get("name")
        if isinstance(name, str):
            name = tools.chat_name(choice.get("namespace"), name)
        return {"type": "function", "function": {"name": name}}
    if isinstance(choice, dict):
        raise invalid(
            "tool_choice",
            f"tool_choice of type {brief(choice.get('type'))} is not supported",
            "unsupported_parameter",
        )
    return choice


def apply_text_format(text, chat: dict) -> None:
    """`text.format` as the chat `response_format`."""
    if text is None:
        return
    check_object(text, "text", ("format", "verbosity"))
    if text.get("verbosity") not in (None, "medium"):  # "medium": OpenAI's default
        raise invalid(
            "text.verbosity",
            'only verbosity "medium" (the default) is supported',
            "unsupported_parameter",
        )
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


SUMMARIES = ("auto", "concise", "detailed")


def apply_reasoning(reasoning, chat: dict) -> bool:
    """`reasoning.effort` as the template's thinking switch (enable_thinking); whether it set
    it. A `summary` (or the older `generate_summary`) is the thinking itself, whole: there is
    no separate summarizer (responses_output.ResponseBuilder)."""
    if reasoning is None:
        return False
    check_object(reasoning, "reasoning", ("effort", "summary", "generate_summary"))
    for k in ("summary", "generate_summary"):
        value = reasoning.get(k)
        if value is not None and value not in SUMMARIES:
            raise invalid(
                f"reasoning.{k}",
                f"reasoning.{k} must be one of {', '.join(SUMMARIES)} or null; got {brief(value)}",
            )
    kwargs = chat.get("chat_template_kwargs")
    if kwargs is None or isinstance(kwargs, dict):  # else the chat parser refuses it
        given = with_effort(kwargs or {}, reasoning.get("effort"), "reasoning.effort")
        if given:
            chat["chat_template_kwargs"] = given
            return reasoning.get("effort") is not None
    return False


# `include` values about items this server never makes (built-in tools, images): nothing to add
_NO_SUCH_ITEMS = (
    "web_search_call.action.sources",
    "web_search_call.results",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
)
ENCRYPTED = "reasoning.encrypted_content"


def wants_encrypted_reasoning(include) -> bool:
    """Whether reasoning items carry `encrypted_content` (here the thinking's text, opaque to
    the client, which sends it back in `input` when it keeps no other copy)."""
    if include is None:
        return False
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise invalid("include", "include must be a list of strings", "invalid_type")
    for x in include:
        if x == "message.output_text.logprobs":
            raise invalid(
                "include", "logprobs are not supported on /v1/responses", "unsupported_parameter"
            )
        if x != ENCRYPTED and x not in _NO_SUCH_ITEMS:
            raise invalid("include", f"include value {brief(x)} is not supported", "invalid_value")
    return ENCRYPTED in include
