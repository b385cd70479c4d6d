"""Thinking: the request's `chat_template_kwargs`, and statistics of the thinking section.

The reply's text is split into reasoning / content by the chat reply (reply.py); here the
generated tokens are followed exactly (the tokenizer's think markers as token ids), so that
`usage` says how many tokens, and how many draft-verify rounds, were spent thinking.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..chat_template import THINKING_KWARG, turn_marks
from ..engine.events import RoundEvent
from ..engine.events import tau as tau_of
from .api_error import brief, invalid, renamed

# Arguments of apply_chat_template itself, or set by the server: not the client's to pass.
RESERVED = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "return_tensors",
        "padding",
        "truncation",
        "max_length",
        "chat_template",
        "tokenizer_kwargs",
        "return_assistant_tokens_mask",
        "raise_exception",
        "strftime_now",
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
    }
)


def parse_template_kwargs(value) -> dict:
    """`chat_template_kwargs`: an object of template variables (checked against the model's
    template when the prompt is built)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(
            "chat_template_kwargs", "chat_template_kwargs must be an object", "invalid_type"
        )
    for k, v in value.items():
        if k in RESERVED:
            raise invalid(
                f"chat_template_kwargs.{k}",
                f"chat_template_kwargs.{k} is set by the server, not by the request",
                "unsupported_parameter",
            )
        if k == THINKING_KWARG and not isinstance(v, bool):
            raise invalid(
                f"chat_template_kwargs.{k}",
                f"chat_template_kwargs.{k} must be a boolean; got {v!r}",
                "invalid_type",
            )
    return dict(value)


# A reasoning effort (chat `reasoning_effort`, Responses `reasoning.effort`) as the template's
# thinking switch: these templates think or not, with no finer setting.
EFFORT_THINKING = {"none": False, "minimal": False}
EFFORT_THINKING |= dict.fromkeys(("low", "medium", "high", "xhigh", "max"), True)


def with_effort(kwargs: dict, effort, where: str) -> dict:
    """`kwargs` (template variables) with the thinking switch `effort` asks for (None: as they
    are); an `enable_thinking` that says otherwise is a 400 naming `where`."""
    if effort is None:
        return kwargs
    if not isinstance(effort, str) or effort not in EFFORT_THINKING:
        raise invalid(
            where, f"{where} must be one of {', '.join(EFFORT_THINKING)}; got {brief(effort)}"
        )
    thinking, given = EFFORT_THINKING[effort], kwargs.get(THINKING_KWARG)
    if given is not None and given is not thinking:
        raise invalid(
            where,
            f"{where}={effort} turns thinking {'on' if thinking else 'off'}, but "
            f"chat_template_kwargs.{THINKING_KWARG} is {str(given).lower()}",
        )
    return {THINKING_KWARG: thinking, **kwargs}


_EFFORT_RENAME = ((rf"^chat_template_kwargs\.{THINKING_KWARG}$", "reasoning_effort"),)


def chat_effort(kwargs: dict, effort):
    """Chat's `reasoning_effort` on the template variables, and the renamer its errors need
    (None when it set no switch): a refused switch is named as the client sent it."""
    out = with_effort(kwargs, effort, "reasoning_effort")
    if effort is None or THINKING_KWARG in kwargs:
        return out, None
    return out, lambda err: renamed(err, err.param or "", _EFFORT_RENAME)


@dataclass
class ThinkingStats:
    """Tokens and rounds inside the thinking section (markers included)."""

    tokens: int = 0
    rounds: int = 0  # draft-verify rounds that began inside it
    drafted: int = 0
    accepted: int = 0

    @property
    def tau(self) -> float:
        return tau_of(self.accepted, self.rounds)


class ThinkingTracker:
    """Follows the think markers through the generated tokens, round by round. `once`: only
    a section the reply opens with (a response_format value's markers are its text)."""

    def __init__(self, tokenizer, state: str, once: bool = False, calls: bool = False):
        """`state`: where the reply starts (ChatPrompt.state); `calls`: its tool calls are
        parsed, so a think marker inside one is the call's text, not a section."""
        self.start = tuple(getattr(tokenizer, "think_start_tokens", None) or ())
        self.end = tuple(getattr(tokenizer, "think_end_tokens", None) or ())
        self.inside = state == "reasoning" and bool(self.end)
        self.call_start, self.call_end = (
            (_marker_ids(tokenizer, "tool_call_start"), _marker_ids(tokenizer, "tool_call_end"))
            if calls
            else ((), ())
        )
        self.in_call = state == "tool" and bool(self.call_end)
        self.tail: list[int] = []
        self.stats = ThinkingStats()
        self.once, self.done = once, False
        self.outside = 0  # with `once`: tokens the reply began with outside a section

    def add(self, ev: RoundEvent) -> None:
        if not self.start or not self.end or self.done:
            return
        if self.inside and not ev.prefill:
            s = self.stats
            s.rounds, s.drafted, s.accepted = (
                s.rounds + 1,
                s.drafted + ev.drafted,
                s.accepted + ev.accepted,
            )
        keep = max(len(self.start), len(self.end), len(self.call_start), len(self.call_end))
        for t in ev.tokens:
            self.tail = (self.tail + [t])[-keep:]
            if self.in_call:
                self.in_call = not self._ends(self.call_end)
            elif self.inside:
                self.stats.tokens += 1
                if self._ends(self.end):
                    self.inside, self.done = False, self.once
            elif self._ends(self.start):
                self.inside = True
                self.stats.tokens += len(self.start)
            elif self.call_end and self._ends(self.call_start):
                self.in_call = True
            elif self.once:  # no start marker where the reply begins: no section
                self.outside += 1
                self.done = self.outside >= len(self.start)
            if self.done:
                return

    def _ends(self, marker: tuple[int, ...]) -> bool:
        return bool(marker) and tuple(self.tail[-len(marker) :]) == marker


def _marker_ids(tokenizer, name: str) -> tuple[int, ...]:
    text = getattr(tokenizer, name, None)
    return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()


def closes_thinking(tokenizer, ids: list[int]) -> bool:
    """The template already wrote the reply's thinking section, closed (thinking turned off:
    Qwen's empty `<think></think>`): no turn marker (a special token) follows its end."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    end = tokenizer.rfind_think_end(ids)
    if end < 0 or tokenizer.rfind_think_start(ids) > end:
        return False
    return not turn_marks(tokenizer).intersection(ids[end + len(tokenizer.think_end_tokens) :])
