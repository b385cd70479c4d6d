"""A chat reply taken apart as it is generated: reasoning, content and tool calls.

mlx-lm's TextStateMachine (the one mlx_lm.server uses) follows the think and tool-call markers
through the decoded text, a round of several tokens at a time included; the tool parser the
tokenizer declares (mlx_lm/tool_parsers/) turns each call's text into a name and arguments. A
call that does not parse stays in the content (or the thinking it was opened in), verbatim:
nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import math
import logging
import uuid
from dataclasses import dataclass

from mlx_lm.generate import TextStateMachine, make_text_state_machine

from ..chat_template import thought_piece
from .api_error import loggable
from .chat_prompt import ChatPrompt
from .reasoning import ThinkingTracker
from .tools import value_schema

log = logging.getLogger("dflash2.serve")


@dataclass(frozen=True)
class Delta:
    kind: str  # "content" | "reasoning" | "tool_call"
    text: str = ""
    call: dict | None = None  # {"index", "id", "type", "function": {"name", "arguments"}}


THINKING_CALL = "thinking_tool"  # a call the model opened inside its thinking section


def _machine(tokenizer, tools: bool) -> TextStateMachine | None:
    """Marker transitions: thinking, and tool calls when the request has tools. A call opened
    inside the thinking section goes back to it when it ends (its think end marker is no
    answer); mlx-lm's machine would go on in the answer."""
    thinks = getattr(tokenizer, "has_thinking", False)
    plain = not (
        getattr(tokenizer, "response_transitions", None)
        or getattr(tokenizer, "structural_markers", None)
    )
    if tools and thinks and plain:
        start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
        return TextStateMachine(
            {
                "normal": [(tokenizer.think_start, "reasoning"), (start, "tool")],
                "reasoning": [(tokenizer.think_end, "normal"), (start, THINKING_CALL)],
                "tool": [(end, "normal")] if end else [],
                THINKING_CALL: [(end, "reasoning")] if end else [],
            }
        )
    if tools or getattr(tokenizer, "response_transitions", None):  # Muse Spark's headers too
        return make_text_state_machine(tokenizer)
    if getattr(tokenizer, "has_thinking", False):
        return TextStateMachine(
            {
                "normal": [(tokenizer.think_start, "reasoning")],
                "reasoning": [(tokenizer.think_end, "normal")],
            }
        )
    return None


HEADER = "header"  # Muse Spark: each message of a reply opens with one (mlx-lm's format)


def _first_state(tokenizer, prompt_state: str) -> str:
    """Where the reply's text starts: in the thinking or call the prompt opened, else where
    the model's response format says (Muse Spark: a message header), else in the answer."""
    if prompt_state != "normal":
        return prompt_state
    return getattr(tokenizer, "response_initial_state", None) or "normal"


class ChatReply:
    """Feed each round's text and event; get the deltas to send; `finish` at the end.
    `value`: the reply is a `response_format` value after at most one thinking section, so
    once the value begins a marker's text inside it is the value's text."""

    def __init__(
        self, tokenizer, prompt: ChatPrompt, id_prefix: str = "call_", value: bool = False
    ):
        self.tok, self.tools = tokenizer, prompt.tools
        self.id_length = prompt.call_id_length  # None: API-style ids, `id_prefix` + hex
        self.id_prefix = id_prefix
        self.machine = _machine(tokenizer, prompt.tools is not None)
        start = _first_state(tokenizer, prompt.state)
        self.state = self.machine.make_state(start) if self.machine else None
        self.current = start
        self.call_text = prompt.call_prefix
        # a call the client's prefill opened: its text is the client's, never sent back
        self.prefilled = (
            tokenizer.tool_call_start + prompt.call_prefix if prompt.call_prefilled else ""
        )
        calls = prompt.tools is not None
        self.thinking = ThinkingTracker(tokenizer, prompt.state, once=value, calls=calls)
        self.value_ahead = value and self.machine is not None  # markers still count
        self.calls: list[dict] = []
        self.unparsed = 0  # call texts the parser refused (kept as text)
        self.dropped = 0  # calls cut before their end (max_tokens, a stop string): dropped
        self.content: list[str] = []
        self.reasoning: list[str] = []
        # With tools: whitespace at the start or after a call, held until text follows
        # (between or around calls it is no answer: Qwen-style templates put "\n" there).
        self.held, self.call_lead, self.after_call = "", "", False
        self.call_from = "normal"  # the section the open call began in
        # The newlines a template puts around a thinking section belong to neither part
        # (Qwen's own template strips them from history): dropped at its start and end, and
        # at the start of the answer after it.
        self.thought_tail = ""  # its trailing newlines, held until more thinking follows
        self.after_thinking = False  # no answer text yet since a thinking section closed

    @classmethod
    def for_request(cls, tokenizer, prompt: ChatPrompt, req) -> "ChatReply":
        """The reply to a GenRequest: Anthropic's tool_use ids read "toolu_..."; a
        response_format reply is a value (not where a forced tool_choice makes it a call)."""
        prefix = "toolu_" if req.anthropic else "call_"
        value = value_schema(req.response_schema, prompt.tools) is not None
        return cls(tokenizer, prompt, prefix, value=value)

    def feed(self, text: str, event) -> list[Delta]:
        self.thinking.add(event)
        if self.machine is None:
            return self._emit([("normal", text)])
        return self._emit(self._split(text))

    def _split(self, text: str) -> list:
        """The machine's segments of `text`. Before a value begins, a character at a time:
        at its first character the markers stop (the rest goes through at once)."""
        if not self.value_ahead:
            self.state, segments = TextStateMachine.split(self.state, text)
            return segments
        segments = []
        for i, ch in enumerate(text):
            self.state, part = TextStateMachine.split(self.state, ch)
            segments += part
            if any(state == "normal" and t.strip() for state, t in part):
                self.value_ahead = False
                name, buffer = self.state[0], self.state[3]
                _, root, states, _ = TextStateMachine({name: []}).make_state(name)
                self.state, part = TextStateMachine.split(
                    (name, root, states, buffer), text[i + 1 :]
                )
                segments += part
                break
        return _merged(segments)

    def finish(self, finish_reason: str, stop: str | None = None) -> tuple[list[Delta], str]:
        """The held-back text and an unclosed call; "stop" becomes "tool_calls" after calls.
        `stop`: the stop string that ended the reply, if one did."""
        out: list[Delta] = []
        if self.machine is not None:
            self.state, rest, state = TextStateMachine.flush(self.state)
            out = self._emit([(state, rest)])
        if self.current == "tool":
            # whole at the end of the reply, at parallel_tool_calls' stop (its end marker), or
            # cut inside its end marker; cut before it (max_tokens, a client's stop string) it
            # is dropped: a lenient parser (GLM's) reads a fragment as a call, and its markup
            # is no answer (an API's content never holds a call's syntax)
            end = self.tok.tool_call_end
            whole = finish_reason == "stop" and stop in (None, end)
            whole = whole or bool(end) and _without_partial(self.call_text, end) != self.call_text
            out += self._close_call(complete=False, cut=not whole)
        if self.held and not self.calls:  # a reply of whitespace alone stays verbatim
            out += self._content("", hold=False)
        if self.calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return out, finish_reason

    def _emit(self, segments) -> list[Delta]:
        out: list[Delta] = []
        for state, text in segments:
            state = "tool" if state == THINKING_CALL else state  # a call, wherever it opened
            if self.current == "reasoning" and state != "reasoning":
                out += self._leave_thinking(state)
            if self.current == "tool" and state != "tool":
                out += self._close_call(complete=True)
            if state == "tool" and self.current != "tool":
                self.call_lead, self.held, self.call_from = self.held, "", self.current
                self.after_thinking = False  # what follows a call is held as usual
            self.current = state
            if not text or state == HEADER:  # a message's header (to=user): no text of it
                continue
            if state == "tool":
                self.call_text += text
            elif state == "reasoning":
                out += self._thought(text)
            else:
                out += self._content(text)
        return out

    def _new_id(self) -> str:
        """A call id the template takes back: the API's form, or the length it requires (hex
        digits: alphanumeric, as Mistral's templates ask)."""
        if self.id_length is None:
            return f"{self.id_prefix}{uuid.uuid4().hex[:24]}"
        return (uuid.uuid4().hex * (1 + self.id_length // 32))[: self.id_length]

    def _call_id(self, given) -> str:
        """The model's own id for a call (Kimi's, Mistral's) where it is one the template takes
        back and no other call of this reply has it; else a new one."""
        if (
            isinstance(given, str)
            and given
            and all(c["id"] != given for c in self.calls)
            and (self.id_length is None or (len(given) == self.id_length and given.isalnum()))
        ):
            return given
        return self._new_id()

    def _thought(self, text: str) -> list[Delta]:
        # only the first section's leading newlines: a later one keeps them
        body, self.thought_tail = thought_piece(text, not self.reasoning, self.thought_tail)
        if not body:
            return []
        self.reasoning.append(body)
        return [Delta("reasoning", body)]

    def _leave_thinking(self, state: str) -> list[Delta]:
        """The section ends (its trailing newlines dropped) or a call opens inside it (they
        stay: the thinking goes on after the call)."""
        tail, self.thought_tail = self.thought_tail, ""
        if state != "tool":
            self.after_thinking = True
            return []
        if not tail:
            return []
        self.reasoning.append(tail)
        return [Delta("reasoning", tail)]

    def _content(self, text: str, hold: bool = True) -> list[Delta]:
        if self.after_thinking and text and not self.content:
            text = text.lstrip("\n")
            self.after_thinking = not text
            if not text:
                return []
        held = self.tools is not None and (not self.content or self.after_call)
        if hold and held and not (self.held + text).strip():
            self.held += text
            return []
        text, self.held, self.after_call = self.held + text, "", False
        self.content.append(text)
        return [Delta("content", text)]

    def _close_call(self, complete: bool, cut: bool = False) -> list[Delta]:
        """The call's text parsed into calls, else kept as text; a `cut` one is dropped (in the
        thinking: kept there). An unclosed call may end in part of its end marker, which is
        no part of the call."""
        text, self.call_text = self.call_text, ""
        end = self.tok.tool_call_end or ""
        known, self.prefilled = self.prefilled, ""  # only the first call can be the prefill's
        call = text if complete else _without_partial(text, end)
        try:
            if cut:
                raise ValueError("the reply was cut inside it")
            parsed = self.tok.tool_parser(call, list(self.tools.tools))
            calls = parsed if isinstance(parsed, list) else [parsed]
            if not calls or not all(
                isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls
            ):
                raise ValueError(f"no function name in {parsed!r}")
            texts = [_arguments_text(c) for c in calls]
        except Exception as e:  # the model's text, not a server fault: keep it as text
            text = (self.tok.tool_call_start + text).removeprefix(known) + (end if complete else "")
            if cut and self.call_from != "reasoning":
                log.warning("a tool call was cut before its end; dropped: %s", loggable(text, 300))
                self.dropped += 1
                self.call_lead = ""  # the whitespace before it is no answer either
                return []
            why = loggable(f"{type(e).__name__}: {e}", 300)  # the model's text: one line
            log.warning("a tool call did not parse (%s); kept as text", why)
            self.unparsed += 1
            self.held, self.call_lead = self.call_lead, ""
            if self.call_from == "reasoning":  # back in the thinking it was written in
                self.reasoning.append(text)
                return [Delta("reasoning", text)]
            return self._content(text, hold=False)
        self.call_lead, self.after_call = "", True
        if not self.tools.parallel and len(self.calls) + len(calls) > 1:
            # one block may hold several (Kimi's), and a format without an end marker
            # (Mistral's) has no stop to end the reply after the first
            log.info("parallel_tool_calls false: kept the first call, dropped %d", len(calls))
            calls = [] if self.calls else calls[:1]
        out = []
        for c, args in zip(calls, texts):
            call = {
                "index": len(self.calls),
                "id": self._call_id(c.get("id")),
                "type": "function",
                "function": {"name": c["name"], "arguments": args},
            }
            self.calls.append(call)
            out.append(Delta("tool_call", call=call))
        return out


def _merged(segments: list) -> list:
    """Adjacent segments of one state as one (a character-at-a-time split would otherwise
    send a delta a character); an empty segment stays where it marks a state entered."""
    out: list = []
    for state, text in segments:
        if out and out[-1][0] == state:
            out[-1] = (state, out[-1][1] + text)
        else:
            out.append((state, text))
    return out


def _without_partial(text: str, marker: str) -> str:
    """`text` less a tail that is the start of `marker` (the rest of it never came)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return text[:-n]
    return text


def _arguments_text(call: dict) -> str:
    """A parsed call's arguments as the JSON text clients get: an object (its parameters'
    schema) in strict JSON — no NaN or Infinity, which strict parsers (JSON.parse) refuse —
    or a ValueError (the call is kept as text)."""
    args = call.get("arguments", {})
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, allow_nan=False)
    if not isinstance(json.loads(text, parse_constant=_no_constant, parse_float=_finite), dict):
        raise ValueError(f"arguments of {call['name']!r} are not a JSON object")
    return text


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: a float that JSON cannot carry back out
        raise ValueError(f"{text} is out of range")
    return value
