"""What a chat reply must follow, decided per request: the grammar (grammar.py builds it) of
`response_format`'s value and/or strict tools' arguments, after the model's thinking section
if it has one (with a forced tool_choice, from inside the call the prompt opened, to a listed
tool); and a thinking budget (engine/budget.py)."""

from __future__ import annotations

from dataclasses import replace

from ..engine.budget import BothFactories, ThinkingBudget
from ..errors import ParameterError
from ..grammar import Calls, Grammar, OpeningRefused, Thinking
from .api_error import APIError, invalid
from .chat_prompt import ChatPrompt
from .reasoning import closes_thinking
from .schemas import GenRequest
from .tools import ToolRequest, value_schema


def reply_constraint(pair, req: GenRequest, prompt: ChatPrompt | None, default_budget=None):
    """GenerationParams.constraint for this reply (None: free text). `default_budget`: the
    server's thinking budget for requests that give none."""
    grammar = reply_grammar(pair, req, prompt)
    n = req.thinking_budget if req.thinking_budget is not None else default_budget
    if n is None or prompt is None:
        return grammar
    vocab = pair.vocab_size
    try:
        budget = ThinkingBudget.for_prompt(pair.tokenizer, prompt.ids, n, vocab)
    except ParameterError as e:
        raise invalid("thinking_budget", f"thinking_budget: {e}") from None
    return budget if grammar is None else BothFactories(grammar, budget)


def reply_grammar(pair, req: GenRequest, prompt: ChatPrompt | None) -> Grammar | None:
    """The grammar the reply must follow (None: free text): `response_format`'s value
    and/or strict tools' arguments, after the model's thinking section if it has one; with
    a forced tool_choice, a call to a listed tool (the one named) with an object of
    arguments, where the model's call format is json_tools (elsewhere the prefilled opening
    of the call alone forces it). Tools strict by default only (ToolRequest.soft) that no
    grammar can hold are not held."""
    tools = prompt.tools if prompt is not None else None
    try:
        return _reply_grammar(pair, req, prompt, tools)
    except APIError:
        if tools is None or not tools.soft:
            raise
        loose = replace(tools, strict=tools.strict - tools.soft, soft=frozenset())
        return _reply_grammar(pair, req, prompt, loose)


def _reply_grammar(pair, req: GenRequest, prompt, tools: ToolRequest | None) -> Grammar | None:
    strict = bool(tools and tools.strict)
    held_call = bool(tools and tools.forced) and _format(pair.tokenizer) == "json_tools"
    schema = value_schema(req.response_schema, tools)
    if schema is None and not strict and not held_call:
        return None
    try:
        calls = _calls(pair, schema, tools, prompt) if tools is not None else None
    except _NotOpened:
        if strict:
            raise _not_opened("does not tokenize on its own", tools.forced) from None
        return None  # forced, not strict: the prefilled opening alone
    forced = prompt is not None and prompt.state == "tool"  # past any thinking already
    thinking = _thinking(pair.tokenizer, prompt) if prompt is not None and not forced else None
    try:
        return pair.grammars.reply(schema, calls, thinking)
    except ParameterError as e:
        if schema is None and not strict:
            # the template's calls are not json_tools' {"name", "arguments"} (arguments
            # first, say): the prefilled opening alone forces the call, as before
            return None
        if isinstance(e, OpeningRefused):
            why = "is not one the grammar of the strict tool's call allows"
            raise _not_opened(why, tools.forced) from None
        where = "response_format" if schema is not None else "tools"
        raise invalid(where, f"{where}: {e}") from None


class _NotOpened(Exception):
    """The forced call's opening does not tokenize on its own at the prompt's end."""


def _not_opened(why: str, forced: bool):
    """The call the prompt opened (a forced tool_choice's, else the prefill's) cannot be held."""
    if not forced:
        return invalid(
            "messages",
            f"strict tools: the tool call the final assistant message opens {why}; leave the "
            "call out of it, or send strict false",
            "unsupported_parameter",
        )
    return invalid(
        "tool_choice",
        f"strict tools with a forced tool_choice: the opening of the call that the prompt "
        f'writes {why}; use tool_choice "auto", or strict false',
        "unsupported_parameter",
    )


def _format(tok) -> str:
    """The model's tool-call format: the name of mlx-lm's parser module."""
    return getattr(getattr(tok, "tool_parser", None), "__module__", "").rsplit(".", 1)[-1]


def _calls(pair, schema: dict | None, tools: ToolRequest, prompt: ChatPrompt) -> Calls:
    """The calls a reply held to a grammar may make: every tool (the one a forced
    tool_choice names), the strict ones with their arguments' schemas, in the model's
    json_tools format; a forced choice goes on from the call the prompt opened. `schema`:
    response_format's, where the reply may answer instead."""
    why = "response_format together with tools" if schema else "strict tools"
    names = [t["function"]["name"] for t in tools.tools]
    first = next((i for i, n in enumerate(names) if n in tools.strict), None)
    tok = pair.tokenizer
    fmt = _format(tok)
    if fmt != "json_tools":
        raise invalid(
            "response_format" if first is None else f"tools[{first}].function.strict",
            f"{why}: the grammar knows the json_tools call format (<tool_call> JSON "
            f"</tool_call>); this model's is {fmt or 'unknown'}"
            + ("" if first is None else " (send strict false)"),
            "unsupported_parameter",
        )
    specs = []  # (name, arguments schema; None: any object)
    for i, t in enumerate(tools.tools):
        fn = t["function"]
        if tools.name is not None and fn["name"] != tools.name:
            continue
        schema = fn.get("parameters") if fn["name"] in tools.strict else None
        calls = Calls(tok.tool_call_start, tok.tool_call_end, ((fn["name"], schema),))
        if schema is not None:  # compiled alone first: an error names this tool
            try:
                pair.grammars.reply(None, calls)
            except ParameterError as e:
                raise invalid(f"tools[{i}].function.parameters", str(e)) from None
        specs.append((fn["name"], schema))
    opened = _opened(tok, prompt) if prompt is not None and prompt.state == "tool" else ()
    return Calls(tok.tool_call_start, tok.tool_call_end, tuple(specs), tools.parallel, opened)


def _opened(tok, prompt: ChatPrompt) -> tuple[int, ...]:
    """The tokens of the call a forced tool_choice (or a prefill) opened at the prompt's end."""
    text = tok.tool_call_start + prompt.call_prefix
    ids = [int(t) for t in tok.encode(text, add_special_tokens=False)]
    if prompt.ids[-len(ids) :] != ids:
        raise _NotOpened()
    return tuple(ids)


def _thinking(tok, prompt: ChatPrompt) -> Thinking | None:
    """The thinking section a reply held to a grammar may start with (the reply follows
    it): the model's markers, where the tokenizer has them and the prompt left it to the
    reply."""
    if not getattr(tok, "has_thinking", False):
        return None
    if prompt.state != "reasoning" and closes_thinking(tok, prompt.ids):
        return None  # the template wrote it, closed (thinking off)
    return Thinking(tok.think_start, tok.think_end, opened=prompt.state == "reasoning")
