"""OpenAI request bodies in, library parameters out. Every field is honoured or refused.

A field that would change the output and is not implemented (best_of, n past MAX_CHOICES, ...)
is refused with a 400 naming it, unless it has its neutral value (best_of=1, ...). Unknown
fields are refused too. Only fields that cannot change the output (user, metadata, ...) are
accepted and unused. Messages are read in chat_messages.py, tools validated in
tools.py, chat_template_kwargs in reasoning.py; whether the model supports them is checked
against its template (chat_prompt.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..sampling import field_problem
from ..settings import SAMPLING_FLAGS
from ..values import is_int, is_number
from .api_error import APIError, brief, check_object, invalid, optional  # noqa: F401  (APIError is imported from here)
from .reasoning import chat_effort, parse_template_kwargs
from .response_format import parse_response_format
from .token_fields import ALIASES, PENALTIES, parse_logprobs, parse_penalties
from .chat_messages import continuation, message, text_content
from .tools import ToolRequest, check_tool_answers, parse_tools
from .unused_fields import OPENAI, check_unused

MAX_STOP = 16
# max_tokens -1 and -2: Ollama's and LM Studio's "no limit" and "fill the context", which Open
# WebUI and LM Studio's clients send; both ask what leaving it out asks
NO_LIMIT = (-1, -2)


def _neutral(*values) -> Callable[[Any], bool]:
    def ok(v):
        return any(
            v is x or (type(v) is type(x) and v == x) or (is_number(v) and is_number(x) and v == x)
            for x in values
        )

    return ok


MAX_CHOICES = 8  # `n`: each choice is a generation of its own

# field -> (neutral value test, what is unsupported)
_CHAT_ONLY = {
    "functions": (lambda v: v is None or v == [], "functions are not supported (use tools)"),
    "function_call": (
        _neutral(None, "none", "auto"),
        "functions are not supported (use tools and tool_choice)",
    ),
    "modalities": (lambda v: v is None or v == ["text"], "only text output is supported"),
    "audio": (_neutral(None), "audio output is not supported"),
    "verbosity": (_neutral(None, "medium"), 'only verbosity "medium" (the default) is supported'),
    "web_search_options": (_neutral(None), "web search is not supported"),
    "store": (_neutral(None, False), "stored completions are not supported"),
}
_COMPLETION_ONLY = {"best_of": (_neutral(None, 1), "only best_of=1 is supported")}
# vLLM's fields, which its clients send (SillyTavern's vLLM text completions, all of them):
# their values here pass, others are refused
_TEXT_FIELDS = {
    "include_stop_str_in_output": (
        _neutral(None, False),
        "the text never includes the stop string that ended it",
    ),
    "ignore_eos": (_neutral(None, False), "a reply ends at the model's end of text"),
    "min_tokens": (_neutral(None, 0), "a reply may end before any token (min_tokens 0)"),
    # its default; with a fast tokenizer (mlx-lm's) it changes nothing
    "spaces_between_special_tokens": (
        _neutral(None, True),
        "special tokens are decoded as the tokenizer decodes them",
    ),
    "typical_p": (_neutral(None, 1), "typical sampling is not supported (1: off)"),
}
_CHAT_ONLY |= _TEXT_FIELDS | {
    # honoured on completions (handler: the special tokens hidden from the text); a chat
    # reply's markers (thinking, tool calls) may be special tokens its parser reads
    "skip_special_tokens": (
        _neutral(None, False),
        "a chat reply keeps the special tokens the model writes (but the end of its turn)",
    )
}
_COMPLETION_ONLY |= _TEXT_FIELDS
# Accepted and unused: they cannot change the generated text.
_HARMLESS = {
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "keep_alive",  # Ollama's: how long the model stays loaded (here: as long as the server)
}
_COMMON = {"model", "max_tokens", "stop", "stream", "stream_options", "n"}
_COMMON |= {*SAMPLING_FLAGS, *PENALTIES, *ALIASES}


@dataclass
class GenRequest:
    kind: str  # "chat" | "completion"
    model: str | None
    sampling_fields: dict[str, Any]  # as given; the others take the server's defaults
    max_tokens: int | None = None  # None: the server default, clipped to the context
    max_tokens_param: str = "max_tokens"
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    prompts: list | None = None  # completions: a batch of prompts (n choices each); else None
    prediction: str | None = None  # predicted output (a drafting hint), chat only
    tools: ToolRequest | None = None  # chat only: tools, tool_choice, parallel_tool_calls
    template_kwargs: dict = field(default_factory=dict)  # chat only: chat_template_kwargs
    # chat only: the JSON schema `response_format` asks for (None: free text)
    response_schema: dict | None = None
    penalties: dict[str, Any] = field(default_factory=dict)  # processors.penalties' settings
    # a /v1/responses request (a chat one inside): the fields its response echoes
    responses: dict | None = None
    encrypted_reasoning: bool = False  # /v1/responses: reasoning items carry encrypted_content
    # /v1/responses: a namespaced function's chat name -> (namespace, its name there)
    tool_namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    anthropic: bool = False  # a /v1/messages request (messages_request.py), chat inside
    thinking_budget: int | None = None  # most tokens in the thinking section (engine/budget.py)
    # how its errors name the fields the client sent (/v1/responses and /v1/messages differ)
    rename: Callable[[APIError], APIError] | None = None
    logprobs: int | None = None  # alternatives per token's log-probability (None: none)
    n: int = 1  # choices: generations of the same prompt (seed + i for choice i)
    # chat only: the final assistant message's text, which the reply continues (its prefill)
    prefill: str | None = None
    generation_prompt: bool = True  # chat only: false renders no assistant header
    suffix: str | None = None  # completions: the text after the middle to fill in (fim.py)
    skip_special_tokens: bool = False  # completions: special tokens are not text (vLLM's)
    echo: bool = False  # completions: the prompt comes back before the completion


def _check_fields(body: dict, own: set[str], refused: dict) -> None:
    for name, value in body.items():
        if name in refused:
            neutral, why = refused[name]
            if not neutral(value):
                raise invalid(name, f"{name}={brief(value)}: {why}", "unsupported_parameter")
        elif name not in own and name not in _HARMLESS and value is not None:  # null: no ask
            raise invalid(
                name, f"Unrecognized request argument supplied: {name[:60]}", "unknown_parameter"
            )
    check_unused(body, OPENAI)


_INT_FIELDS = ("top_k", "seed")
_STREAM_OPTIONS = ("include_usage", "include_obfuscation")


def _sampling(body: dict) -> dict[str, Any]:
    """The sampling fields the request gives, each checked by the library's rule for it.
    Omitted (or null) fields are not here: they take the server's defaults (handler)."""
    given = {}
    for name in SAMPLING_FLAGS:
        v = body.get(name)
        if v is None:
            continue
        integer = name in _INT_FIELDS
        if not (is_int(v) if integer else is_number(v)):
            raise invalid(
                name,
                f"{name} must be {'an integer' if integer else 'a number'}; got {brief(v)}",
                "invalid_type",
            )
        if name == "top_k" and v == -1:  # vLLM's and mlx-lm's "off"
            v = 0
        if name == "seed" and not -(2**63) <= v < 2**64:  # an int64 (OpenAI's) or a uint64
            raise invalid(name, f"seed must be an integer in [-2**63, 2**64); got {brief(v)}")
        if name == "seed" and v < 0:  # OpenAI's seeds are int64: the same bits
            v %= 2**64
        problem = field_problem(name, v)
        if problem:
            raise invalid(name, f"{problem}; got {brief(v)}")
        given[name] = v if integer else float(v)
    return given


def check_token_limit(body: dict, name: str) -> None:
    """A 400 for a limit below 1 where no "no limit" value is taken (/v1/messages' required
    max_tokens, /v1/responses' max_output_tokens: their APIs' own rule), before the body
    becomes a chat one (whose max_tokens takes -1 and -2: NO_LIMIT)."""
    v = body.get(name)
    if is_int(v) and v < 1:
        raise invalid(name, f"{name} must be >= 1; got {v}")


def _common(body: dict, kind: str, max_param: str, least: int = 1) -> GenRequest:
    """The fields chat and completions share; max_tokens >= `least` (0: an echo's)."""
    model = optional(body, "model", lambda v: isinstance(v, str), "a string")
    limit = None
    for name in ("max_tokens", "max_completion_tokens"):
        v = optional(body, name, is_int, "an integer")
        if v in NO_LIMIT:
            continue  # as if left out
        if v is not None and v < least:
            why = " (0 only with echo: the prompt alone)" if kind == "completion" else ""
            raise invalid(
                name, f"{name} must be >= {least}{why}, or -1 / -2 for the default; got {v}"
            )
        if v is not None and limit is not None and v != limit:
            raise invalid(name, "max_tokens and max_completion_tokens disagree; send one")
        if v is not None:
            limit, max_param = v, name
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("stop", "stop must be a string or a list of strings", "invalid_type")
    if len(stop) > MAX_STOP or not all(stop):
        raise invalid("stop", f"stop takes 1 to {MAX_STOP} non-empty strings")
    stream = bool(optional(body, "stream", lambda v: isinstance(v, bool), "a boolean"))
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise invalid("stream_options", "stream_options is only allowed when stream is true")
        if not isinstance(opts, dict):
            raise invalid("stream_options", "stream_options must be an object", "invalid_type")
        for k, v in opts.items():
            if k not in _STREAM_OPTIONS:
                raise invalid(
                    f"stream_options.{k}",
                    f"stream_options.{k} is not supported",
                    "unsupported_parameter",
                )
            if v is not None and not isinstance(v, bool):
                raise invalid(
                    f"stream_options.{k}", f"stream_options.{k} must be a boolean", "invalid_type"
                )
            if k == "include_obfuscation" and v:  # OpenAI's padding against side channels
                raise invalid(
                    f"stream_options.{k}",
                    f"stream_options.{k}=true is not supported (chunks carry no "
                    "obfuscation field); send false",
                    "unsupported_parameter",
                )
            include_usage = include_usage or (k == "include_usage" and bool(v))
    req = GenRequest(kind, model, _sampling(body), limit, max_param, stop, stream, include_usage)
    req.penalties = parse_penalties(body)
    req.logprobs = parse_logprobs(body, kind)
    n = optional(body, "n", is_int, "an integer")
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise invalid("n", f"n must be in [1, {MAX_CHOICES}]; got {n}")
    req.n = n or 1
    return req


def _prediction(value) -> str | None:
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or text parts}."""
    if value is None:
        return None
    check_object(value, "prediction", ("type", "content"))
    if value.get("type") != "content":
        raise invalid(
            "prediction.type", f'prediction.type must be "content"; got {brief(value.get("type"))}'
        )
    return text_content("prediction.content", value.get("content"), "")


def parse_chat(body: dict) -> GenRequest:
    _check_fields(
        body,
        _COMMON
        | {
            "messages",
            "max_completion_tokens",
            "prediction",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "chat_template_kwargs",
            "reasoning_effort",
            "thinking_budget",
            "response_format",
            "logprobs",
            "top_logprobs",
            "continue_final_message",
            "add_generation_prompt",
        },
        _CHAT_ONLY,
    )
    messages = body.get("messages")
    if messages is None:
        raise invalid("messages", "messages is required", "missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid("messages", "messages must be a list of messages", "invalid_type")
    if not messages:
        raise invalid("messages", "messages is empty: at least one message is needed")
    out = [message(i, m) for i, m in enumerate(messages)]
    check_tool_answers(out)
    req = _common(body, "chat", "max_completion_tokens")
    req.messages, req.prefill, req.generation_prompt = continuation(body, out)
    req.prediction = _prediction(body.get("prediction"))
    req.tools = parse_tools(body)
    if req.logprobs is not None and req.tools is not None and req.tools.active:
        raise invalid("logprobs", "logprobs with tools are not supported", "unsupported_parameter")
    kwargs = parse_template_kwargs(body.get("chat_template_kwargs"))
    req.template_kwargs, req.rename = chat_effort(kwargs, body.get("reasoning_effort"))
    budget = optional(body, "thinking_budget", is_int, "an integer")
    if budget is not None and budget < 0:  # 0: an empty thinking section
        raise invalid("thinking_budget", f"thinking_budget must be >= 0; got {budget}")
    req.thinking_budget = budget
    req.response_schema = parse_response_format(body.get("response_format"))
    if req.prefill is not None and req.response_schema is not None:
        raise invalid(
            "response_format",
            "a response_format schema cannot go with a final assistant message to continue "
            "(the reply would start inside it)",
            "unsupported_parameter",
        )
    return req


def parse_completion(body: dict) -> GenRequest:
    own = {"prompt", "logprobs", "suffix", "echo", "skip_special_tokens"}
    _check_fields(body, _COMMON | own, _COMPLETION_ONLY)
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("prompt", "prompt is required", "missing_required_parameter")
    suffix = optional(body, "suffix", lambda v: isinstance(v, str), "a string")
    echo = bool(optional(body, "echo", lambda v: isinstance(v, bool), "a boolean"))
    if echo and suffix is not None:
        raise invalid("echo", "echo cannot be used with suffix", "unsupported_parameter")
    batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
    prompts = [
        _one_prompt(p, f"prompt[{i}]" if batch else "prompt", suffix)
        for i, p in enumerate(prompt if batch else [prompt])
    ]
    req = _common(body, "completion", "max_tokens", least=0 if echo else 1)
    req.prompt, req.suffix = prompts[0], suffix  # "": the cursor at the end (handler.tokenize)
    req.echo = echo
    skip = optional(body, "skip_special_tokens", lambda v: isinstance(v, bool), "a boolean")
    req.skip_special_tokens = bool(skip)
    req.prompts = prompts if len(prompts) > 1 else None
    return req


def _one_prompt(prompt, where: str, suffix: str | None):
    """A string or a list of token ids (one prompt of a batch, or the prompt)."""
    text = isinstance(prompt, str)
    if not text and not (isinstance(prompt, list) and all(is_int(t) for t in prompt)):
        raise invalid(where, f"{where} must be a string or a list of token ids", "invalid_type")
    if len(prompt) == 0 and suffix is None:  # with a suffix: a middle at the text's start
        raise invalid(where, f"{where} is empty")
    return prompt
