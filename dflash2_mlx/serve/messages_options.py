"""The options of an Anthropic Messages request (tools, tool_choice, thinking, output_config)
as the chat fields they amount to (messages_request.py)."""

from __future__ import annotations

from ..values import is_int
from .api_error import brief, check_object, invalid, not_typed_object

_EFFORTS = ("low", "medium", "high", "xhigh", "max")
# tool field -> values that change nothing here: how a call's input streams (this server sends
# it whole), and every tool loaded up front
_TOOL_NEUTRAL = {"eager_input_streaming": (None, False, True), "defer_loading": (None, False)}


def chat_tools(tools) -> list:
    """Anthropic's client tools as chat function tools (input_schema: parameters)."""
    if not isinstance(tools, list):
        raise invalid("tools", "tools must be a list of tools", "invalid_type")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or (t.get("type") or "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else t
            raise invalid(
                f"tools[{i}].type",
                f"only custom (client) tools are supported; got {brief(kind)}",
                "unsupported_parameter",
            )
        fn = {"name": t.get("name"), "parameters": t.get("input_schema")}
        if t.get("description") is not None:
            fn = {
                "name": fn["name"],
                "description": t["description"],
                "parameters": fn["parameters"],
            }
        if t.get("strict") is not None:
            fn["strict"] = t["strict"]
        extra = set(t) - {"type", "name", "description", "input_schema", "strict", "cache_control"}
        extra = {k for k in extra if not any(t[k] is v for v in _TOOL_NEUTRAL.get(k, ()))}
        if extra:
            key = sorted(extra)[0]
            raise invalid(
                f"tools[{i}].{key}", f"tools[{i}].{key} is not supported", "unsupported_parameter"
            )
        out.append({"type": "function", "function": fn})
    return out


def apply_tool_choice(choice, chat: dict) -> None:
    """auto / any / tool / none (disable_parallel_tool_use) as the chat tool_choice."""
    if choice is None:
        return
    if not isinstance(choice, dict):  # {"type": "auto"}, not "auto" as OpenAI's
        raise not_typed_object("tool_choice", choice)
    kind = choice.get("type")
    names = {"auto": "auto", "any": "required", "none": "none"}
    if kind in ("auto", "any", "tool", "none"):
        keys = ("type", "disable_parallel_tool_use") + (("name",) if kind == "tool" else ())
        check_object(choice, "tool_choice", keys)
    if kind in ("any", "tool") and not chat.get("tools"):
        raise invalid("tool_choice.type", f"tool_choice.type {kind!r} needs tools")
    if isinstance(kind, str) and kind in names:
        chat["tool_choice"] = names[kind]
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise invalid(
            "tool_choice.type",
            f"tool_choice.type must be auto, any, tool or none; got {brief(kind)}",
        )
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def apply_thinking(thinking, chat: dict) -> int | None:
    """enabled / adaptive / disabled: the template's thinking switch; returns the budget (the
    most tokens the thinking section may hold: engine/budget.py), None: none."""
    if thinking is None:
        return None
    if not isinstance(thinking, dict):
        raise not_typed_object("thinking", thinking)
    kind = thinking.get("type")
    if not isinstance(kind, str) or kind not in ("enabled", "disabled", "adaptive"):
        raise invalid(
            "thinking.type",
            f"thinking.type must be enabled, adaptive or disabled; got {brief(kind)}",
        )
    for k, v in thinking.items():
        if k not in ("type", "budget_tokens", "display") or (k == "display" and v == "omitted"):
            raise invalid(
                f"thinking.{k}",
                f"thinking.{k}={brief(v)} is not supported",
                "unsupported_parameter",
            )
    budget = thinking.get("budget_tokens")
    if budget is not None and kind != "enabled":
        raise invalid(
            "thinking.budget_tokens",
            f"thinking.budget_tokens goes with thinking.type enabled, not {kind}",
            "unsupported_parameter",
        )
    if budget is not None and not is_int(budget, 1):
        raise invalid(
            "thinking.budget_tokens", f"budget_tokens must be an int >= 1; got {brief(budget)}"
        )
    # adaptive: the model decides, here its template's default (one that never thinks answers)
    chat["chat_template_kwargs"] = (
        {} if kind == "adaptive" else {"enable_thinking": kind == "enabled"}
    )
    return budget


def apply_output_config(config, chat: dict) -> None:
    """`format` (a JSON schema) as the chat response_format. `effort` is checked: as in
    Anthropic's API it turns no thinking on (`thinking` does), and the answer's length it
    scales there has no knob here."""
    if config is None:
        return
    check_object(config, "output_config", ("format", "effort"))
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise invalid(
                "output_config.format.type", "output_config.format.type must be json_schema"
            )
        check_object(fmt, "output_config.format", ("type", "schema"))
        if not isinstance(fmt.get("schema"), dict):
            raise invalid(
                "output_config.format.schema",
                f"output_config.format.schema must be a JSON schema object; got "
                f"{brief(fmt.get('schema'))}",
                "invalid_type" if "schema" in fmt else "missing_required_parameter",
            )
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"schema": fmt.get("schema")},
        }
    effort = config.get("effort")
    if effort is not None:
        if effort not in _EFFORTS:
            raise invalid(
                "output_config.effort", f"output_config.effort must be one of {', '.join(_EFFORTS)}"
            )
