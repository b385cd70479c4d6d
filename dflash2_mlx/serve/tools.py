"""OpenAI tools in a chat request: `tools`, `tool_choice`, `parallel_tool_calls` and the tool
calls of the history, validated (a 400 names the field) and put in the form chat templates
take (arguments as objects, as mlx-lm's server and Hugging Face templates expect).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .api_error import brief, invalid

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one request. choice: "auto" | "none" | "required" | "function" (`name`)."""

    tools: tuple[dict, ...]  # [{"type": "function", "function": {...}}] as the template takes
    choice: str = "auto"
    name: str | None = None  # the function `tool_choice` names
    parallel: bool = True  # False: at most one call
    strict: frozenset[str] = frozenset()  # tools whose arguments must follow their schema
    # of those, strict by default only (Responses' omitted `strict`, a forced tool_choice's
    # tools): held to their schema where the grammar can be (json_tools models, schemas
    # llguidance compiles), else not
    soft: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        """Tools are rendered into the prompt and the reply's calls are parsed."""
        return self.choice != "none" and bool(self.tools)

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")


def value_schema(schema: dict | None, tools: ToolRequest | None) -> dict | None:
    """response_format's schema as the reply holds it: none where a forced tool_choice makes
    the reply a call, with no text for the format to hold (instructor's RESPONSES_TOOLS sends
    both, as OpenAI takes)."""
    return None if tools is not None and tools.forced else schema


def _function(i: int, tool) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise invalid(where, f"{where} must be an object", "invalid_type")
    if tool.get("type") != "function":
        raise invalid(
            f"{where}.type",
            f'{where}.type must be "function" (the only tool type '
            f"supported); got {tool.get('type')!r}",
        )
    for k in tool:
        if k not in ("type", "function"):
            raise invalid(f"{where}.{k}", f"{where}.{k} is not supported", "unsupported_parameter")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise invalid(
            f"{where}.function",
            f"{where}.function must be an object",
            "missing_required_parameter" if fn is None else "invalid_type",
        )
    where += ".function"
    for k in fn:
        if k not in _FUNCTION_KEYS:
            raise invalid(f"{where}.{k}", f"{where}.{k} is not supported", "unsupported_parameter")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid(
            f"{where}.name",
            f"{where}.name must be 1 to 64 letters, digits, _ or -; got {name!r}",
            "missing_required_parameter" if name is None else "invalid_value",
        )
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise invalid(
            f"{where}.description", f"{where}.description must be a string", "invalid_type"
        )
    params = fn.get("parameters")
    if params is not None and (
        not isinstance(params, dict) or params.get("type", "object") != "object"
    ):
        raise invalid(
            f"{where}.parameters",
            f'{where}.parameters must be a JSON Schema object with "type": "object"',
            "invalid_type",
        )
    if isinstance(params, dict) and not isinstance(params.get("properties", {}), dict):
        raise invalid(
            f"{where}.parameters.properties",
            f"{where}.parameters.properties must be an object (name -> schema)",
            "invalid_type",
        )
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise invalid(f"{where}.strict", f"{where}.strict must be a boolean", "invalid_type")
    return {"type": "function", "function": {k: v for k, v in fn.items() if k != "strict"}}


def _choice(value, names: list[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in CHOICES:
            raise invalid(
                "tool_choice",
                'tool_choice must be "none", "auto", "required" '
                f'or {{"type": "function", "function": {{"name": ...}}}}; '
                f"got {value!r}",
            )
        if value == "required" and not names:
            raise invalid("tool_choice", 'tool_choice "required" needs tools')
        return value, None
    if not isinstance(value, dict):
        raise invalid("tool_choice", "tool_choice must be a string or an object", "invalid_type")
    if value.get("type") != "function":
        raise invalid(
            "tool_choice.type", f'tool_choice.type must be "function"; got {value.get("type")!r}'
        )
    fn = value.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise invalid(
            "tool_choice.function.name",
            "tool_choice.function.name is required, naming one of the tools "
            f"({', '.join(names) or 'none given'})",
            "missing_required_parameter" if name is None else "invalid_type",
        )
    if name not in names:
        raise invalid(
            "tool_choice.function.name",
            f"tool_choice names {name!r}, which is not "
            f"among the tools ({', '.join(names) or 'none given'})",
        )
    return "function", name


def parse_tools(body: dict) -> ToolRequest | None:
    """`tools`, `tool_choice`, `parallel_tool_calls` of a chat body; None when there are none."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise invalid("tools", "tools must be a list of tools", "invalid_type")
    tools = [_function(i, t) for i, t in enumerate(raw or [])]
    names = [t["function"]["name"] for t in tools]
    strict = frozenset(n for n, t in zip(names, raw or []) if t["function"].get("strict") is True)
    for i, n in enumerate(names):
        if n in names[:i]:
            raise invalid(f"tools[{i}].function.name", f"two tools are named {n!r}")
    choice, name = _choice(body.get("tool_choice"), names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid(
            "parallel_tool_calls", "parallel_tool_calls must be a boolean", "invalid_type"
        )
    if not tools:
        return None
    soft = frozenset()
    if choice in ("required", "function"):  # a forced call's arguments follow their schema,
        # strict or not (as vLLM holds them), where a grammar can hold them (ToolRequest.soft)
        soft = frozenset(n for n in names if n not in strict and name in (None, n))
    return ToolRequest(tuple(tools), choice, name, parallel is not False, strict | soft, soft)


def _arguments(where: str, args):
    """OpenAI sends arguments as a JSON string; templates take the object. A string that is
    not a JSON object (a call cut short, another provider's) reaches the template as it is:
    the API treats it as opaque, and a client resends its history every turn, so a 400 here
    would end the conversation. A template that cannot take a string refuses it (a 400)."""
    if not isinstance(args, str):
        raise invalid(where, f"{where} must be a JSON string", "invalid_type")
    try:
        value = json.loads(args) if args.strip() else {}
    except ValueError:
        return args
    return value if isinstance(value, dict) else args


def history_tool_calls(i: int, calls) -> list[dict]:
    """An assistant message's `tool_calls`, in the form chat templates take."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise invalid(where, f"{where} must be a list", "invalid_type")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise invalid(at, f"{at} must be a function call object", "invalid_type")
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(
                f"{at}.function", f"{at}.function must be an object with a name", "invalid_type"
            )
        entry = {
            "type": "function",
            "function": {
                "name": fn["name"],
                "arguments": _arguments(f"{at}.function.arguments", fn.get("arguments", "{}")),
            },
        }
        if call.get("id") is not None:
            if not isinstance(call["id"], str):
                raise invalid(f"{at}.id", f"{at}.id must be a string", "invalid_type")
            entry["id"] = call["id"]
        out.append(entry)
    return out


def tool_call_id(i: int, value) -> str:
    """A tool message's `tool_call_id` (required, as OpenAI's API has it)."""
    where = f"messages[{i}].tool_call_id"
    if not isinstance(value, str) or not value:
        raise invalid(
            where,
            f"a tool message needs {where}: the id of the call it answers",
            "missing_required_parameter" if value is None else "invalid_type",
        )
    return value


def check_tool_answers(messages: list[dict]) -> None:
    """Each tool message answers a call of the assistant message before it (tool messages
    between), as OpenAI's and Anthropic's APIs require: a client's history bug is a 400, not a
    prompt the model misreads. Calls sent without ids are not matched."""
    ids: set[str] | None = None  # what the next tool messages may answer; None: no calls
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            if ids is None:
                raise invalid(
                    f"messages[{i}]",
                    f"messages[{i}]: a tool result must follow an assistant turn that calls "
                    "tools (or other tool results answering those calls)",
                )
            if ids and m["tool_call_id"] not in ids:
                raise invalid(
                    f"messages[{i}].tool_call_id",
                    f"messages[{i}].tool_call_id {brief(m['tool_call_id'])} answers none of "
                    f"the calls before it ({', '.join(sorted(ids))})",
                )
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            ids = {c["id"] for c in calls} if all("id" in c for c in calls) else set()
        else:
            ids = None
