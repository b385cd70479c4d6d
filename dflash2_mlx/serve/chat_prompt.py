"""A chat request's prompt: messages, tools and template switches through the model's own chat
template, checked against what that template supports (else a 400 naming the field).

`tool_choice` "required" or a named function is honoured without touching the sampler: the
opening of a call, as the template itself renders one, is prefilled after the generation
prompt, so the reply starts inside a call (to that function). The opening is the text two
renderings of an assistant call share (different names and arguments for "required", the same
name with different arguments for a named function), up to its last whitespace; what the
template puts before a call (Qwen3: an empty thinking section) comes with it. A template whose
calls do not open with a fixed text (the name included, for a named function) gets a 400.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from ..chat_template import THINKING_KWARG, TemplateInfo, render_text, thinking_left_open
from ..engine.prompt_cache import common_prefix
from ..errors import DFlash2Error
from ..text import chat_prompt_ids, quiet_length_warning
from .api_error import APIError, invalid
from .tools import ToolRequest


# Two user messages whose first tokens differ (different first bytes): ChatTemplate._preamble
# renders the system messages and tools with each, and keeps what the two share.
PREAMBLE_PROBES = ("\u2063", "~")
PREAMBLES_KEPT = 16

# How each API turns thinking off (an error about one names them all: it may have come through
# any of them).
THINKING_OFF = (
    "turn thinking off (chat: chat_template_kwargs.enable_thinking false or reasoning_effort "
    "none; Messages: thinking type disabled; Responses: reasoning.effort none)"
)


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    state: str = "normal"  # where the reply starts: "normal" | "reasoning" | "tool"
    call_prefix: str = ""  # the forced call's text after the start marker (already in ids)
    stops: tuple[str, ...] = ()  # stop strings the tools add (parallel_tool_calls false)
    tools: ToolRequest | None = None  # active tools: the reply's calls are parsed
    call_id_length: int | None = None  # the template's required tool-call id length
    call_prefilled: bool = False  # the client's prefill opened the call (it has that text)
    # ids another conversation with the same system messages and tools shares (0: not known)
    preamble: int = 0


def _template_call(fn) -> object:
    """Run a template render; a template that refuses the input is the client's 400 — its
    own errors (jinja2's) and its filters' (`|items` over a string: a TypeError) alike."""
    try:
        return fn()
    except DFlash2Error as e:
        raise invalid("messages", str(e)) from None
    except APIError:
        raise
    except Exception as e:
        what = e if type(e).__module__.startswith("jinja2") else f"{type(e).__name__}: {e}"
        raise invalid("messages", f"the chat template rejected the messages: {what}") from None


class ChatTemplate:
    """The served model's chat template: what it supports, and requests turned into prompts."""

    def __init__(self, tokenizer, thinking: bool | None = None):
        self.tok = tokenizer
        # find each prompt's ChatPrompt.preamble (a hybrid target's prompt cache keeps the
        # state there: engine/prompt_cache.py)
        self.find_preamble = False
        self._preambles: dict[str, list[int]] = {}  # _preamble's renderings, by their input
        self.info = TemplateInfo.of(tokenizer)
        if thinking is not None and not self.info.honours_thinking(thinking):
            raise DFlash2Error(
                f"{'--thinking' if thinking else '--no-thinking'}: this model's chat template "
                f"has no thinking switch (enable_thinking) and it "
                f"{'never' if thinking else 'always'} thinks"
            )
        # without a switch, what the model does anyway: nothing to set
        self.thinking = thinking if self.info.thinking_switch else None

    @property
    def tool_calling(self) -> bool:
        return self.info.tool_calling and self.info.renders_tools

    # ------------------------------------------------------------------ checks
    def template_kwargs(self, given: dict) -> dict:
        """The request's template variables, checked; the server's thinking default added."""
        out = {}
        for k, v in given.items():
            if k == THINKING_KWARG and not self.info.thinking_switch:
                if self.info.honours_thinking(v):
                    continue  # what the model does anyway (it always / never thinks)
                raise invalid(
                    f"chat_template_kwargs.{k}",
                    f"chat_template_kwargs.{k}: this model's chat template has no thinking "
                    f"switch (the model {'always' if self.info.thinks else 'never'} thinks)",
                )
            if self.info.reads(k) is False:
                raise invalid(
                    f"chat_template_kwargs.{k}",
                    f"this model's chat template does not read {k!r}",
                    "unsupported_parameter",
                )
            out[k] = v
        if THINKING_KWARG not in out and self.thinking is not None:
            out[THINKING_KWARG] = self.thinking
        return out

    def _check_tools(self) -> None:
        if not self.info.tool_calling:
            raise invalid(
                "tools",
                "this model declares no tool-call format that mlx-lm can "
                "parse (its tokenizer has no tool parser), so tools are not supported",
                "unsupported_parameter",
            )
        if not self.info.renders_tools:
            raise invalid(
                "tools",
                "this model's chat template does not render tools, so tools are not supported",
                "unsupported_parameter",
            )

    # ------------------------------------------------------------------ the prompt
    def prompt(
        self,
        messages: list[dict],
        tools: ToolRequest | None,
        given: dict,
        prefill: str | None = None,
        header: bool = True,
    ) -> ChatPrompt:
        """`prefill`: text the reply continues (after the generation prompt); `header` false:
        no generation prompt (the reply continues the last message's turn)."""
        kwargs = self.template_kwargs(given)
        active = tools if tools is not None and tools.active else None
        if active is not None:
            self._check_tools()
        listed = list(active.tools) if active else None
        messages = _template_call(lambda: self._show_names(messages, listed, kwargs))
        _template_call(lambda: self._check_history_calls(messages, listed, kwargs))
        with quiet_length_warning():  # the handler checks the context itself (a 400)
            ids = _template_call(
                lambda: chat_prompt_ids(
                    self.tok,
                    messages,
                    tools=listed,
                    template_kwargs=kwargs,
                    add_generation_prompt=header,
                )
            )
        if active is not None and active.forced and (prefill is not None or not header):
            raise invalid(
                "tool_choice",
                "a forced tool_choice opens the reply with a tool call after the generation "
                "prompt, so the reply cannot "
                + (
                    "continue a final assistant message"
                    if prefill is not None
                    else "go without one"
                ),
                "unsupported_parameter",
            )
        call = None  # the call a prefill leaves open: the reply goes on inside it
        if prefill is not None:
            ids, call = self._prefilled(ids, prefill, active)
        state = "reasoning" if thinking_left_open(self.tok, ids) else "normal"
        stops = ()
        if active is not None and not active.parallel and self.tok.tool_call_end:
            # the end of the first call ends the reply (without an end marker, Mistral's,
            # the reply keeps its first call: serve/reply.py)
            stops = (self.tok.tool_call_end,)
        preamble = self._preamble(messages, listed, kwargs, ids) if self.find_preamble else 0
        common = dict(tools=active, call_id_length=self.info.call_id_length, preamble=preamble)
        if call is not None:
            return ChatPrompt(ids, "tool", call, stops, call_prefilled=True, **common)
        if active is None or not active.forced:
            return ChatPrompt(ids, state, "", stops, **common)
        lead, opening = _template_call(
            lambda: self._call_opening(messages, listed, kwargs, active.name)
        )
        ids = ids + [int(t) for t in self.tok.encode(lead + opening, add_special_tokens=False)]
        if thinking_left_open(self.tok, ids):
            raise invalid(
                "tool_choice",
                "a forced tool_choice makes the reply open with a tool call, but this prompt "
                f"leaves a thinking section open; {THINKING_OFF}",
            )
        call = opening[len(self.tok.tool_call_start) :]
        return ChatPrompt(ids, "tool", call, stops, **common)

    def _preamble(self, messages: list[dict], tools, kwargs: dict, ids: list[int]) -> int:
        """The ids of `ids` that a conversation with the same leading system messages and
        tools renders alike: what two renderings of them with different user messages
        share (kept for the last few such preambles); 0 with neither, or if the template
        refuses them."""
        lead = 0
        while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
            lead += 1
        if lead == 0 and not tools:
            return 0
        key = json.dumps([messages[:lead], tools, kwargs], sort_keys=True, default=str)
        shared = self._preambles.pop(key, None)
        if shared is None:
            try:
                a, b = (
                    chat_prompt_ids(
                        self.tok,
                        [*messages[:lead], {"role": "user", "content": probe}],
                        tools=tools,
                        template_kwargs=kwargs,
                    )
                    for probe in PREAMBLE_PROBES
                )
            except Exception:  # a template that wants more (e.g. alternating turns): none known
                a = b = []
            shared = a[: common_prefix(a, b, len(a))]
        self._preambles[key] = shared  # the most recent last
        while len(self._preambles) > PREAMBLES_KEPT:
            del self._preambles[next(iter(self._preambles))]
        return common_prefix(ids, shared, len(shared))

    def _prefilled(self, ids: list[int], prefill: str, tools) -> tuple[list[int], str | None]:
        """The prompt with the reply's prefill after it, and the text of the tool call it
        leaves open (after the start marker; None: none), where tools are active: the reply
        goes on inside that call, as after a forced tool_choice's opening. Not inside a
        thinking section the template opens: the prefill is meant as the answer's start."""
        if thinking_left_open(self.tok, ids):
            raise invalid(
                "messages",
                "this prompt opens a thinking section, so the final assistant message cannot "
                f"be continued as the answer; {THINKING_OFF}",
                "unsupported_parameter",
            )
        start, end = self.tok.tool_call_start, self.tok.tool_call_end
        # (a format without an end marker, Mistral's, cannot tell an open call from a whole one)
        at = prefill.rfind(start) if tools is not None and start and end else -1
        if at < 0 or end in prefill[at:]:
            at, call = len(prefill), None
        else:  # encoded as a forced call's opening is (constrained.py checks it is there)
            call = prefill[at + len(start) :]
        text = self.tok.encode(prefill[:at], add_special_tokens=False, split_special_tokens=True)
        opening = (
            self.tok.encode(start + call, add_special_tokens=False) if call is not None else []
        )
        return ids + [int(t) for t in [*text, *opening]], call  # other marker text is text

    def _show_names(self, messages: list[dict], tools, kwargs: dict) -> list[dict]:
        """Participant names reach the model: through the template for the roles whose names
        it renders, else as "name: " before the message's text. Assistant names are written
        only when the history holds two or more (a multi-agent chat): one name is the model's
        own and, written into its turns, would teach it to open its reply with it. A tool
        message's name is its function's, which templates render their own way. A name that
        repeats its role (AutoGen's "user" on every user message) says nothing: dropped."""
        speakers = {m["name"] for m in messages if m.get("name") and m["role"] == "assistant"}
        messages = [_unnamed(m) if _names_its_role(m) else m for m in messages]
        named = [m for m in messages if m.get("name") and m["role"] != "tool"]
        roles = {m["role"] for m in named}
        if not roles:
            return messages
        if len(speakers) == 1:
            roles.discard("assistant")
            messages = [_unnamed(m) if m["role"] == "assistant" else m for m in messages]
        if not getattr(self.tok, "chat_template", None):  # the plain "role: text" fallback
            return [_folded(m) if m["role"] in roles else m for m in messages]

        def text(ms: list[dict]) -> str:
            return render_text(self.tok, ms, tools=tools, **kwargs)

        def without(role: str) -> list[dict]:
            return [_unnamed(m) if m["role"] == role else m for m in messages]

        full = text(messages)
        folded = {r for r in roles if text(without(r)) == full}  # the template drops them
        return [_folded(m) if m["role"] in folded else m for m in messages]

    def _check_history_calls(self, messages: list[dict], tools, kwargs: dict) -> None:
        """A call in the history reaches the model or is a 400: some templates (SmolLM2's)
        render an assistant turn's content only, and the model would read a tool's answer to
        a call it cannot see."""
        at = next((i for i, m in enumerate(messages) if m.get("tool_calls")), None)
        if at is None:
            return
        fn = {"name": "probe_", "arguments": {"x_": 1}}
        probe = {"id": self._probe_id(), "type": "function", "function": fn}
        other = [*messages[:at], {**messages[at], "tool_calls": [probe]}, *messages[at + 1 :]]

        def text(ms: list[dict]) -> str:
            return render_text(self.tok, ms, tools=tools, **kwargs)

        # no template: the plain "role: text" fallback has no place for calls either
        if not getattr(self.tok, "chat_template", None) or text(messages) == text(other):
            raise invalid(
                f"messages[{at}].tool_calls",
                f"messages[{at}].tool_calls: this model's chat template does not render tool "
                "calls, so the model would not see them",
                "unsupported_parameter",
            )

    def _probe_id(self, name: str = "probe_") -> str:
        """A call id for the renders that probe the template: of the length it requires
        (Mistral's templates refuse any other: every turn after a call was a 400), or Kimi's
        `functions.NAME:0` (its template writes the id where others write the name)."""
        n = self.info.call_id_length
        if n:
            return ("probe" + "0" * n)[:n]
        parser = getattr(getattr(self.tok, "tool_parser", None), "__module__", "")
        return f"functions.{name}:0" if parser.startswith("mlx_lm.tool_parsers.kimi") else "call_0"

    def _call_opening(
        self, messages: list[dict], tools: list[dict], kwargs: dict, name: str | None
    ) -> tuple[str, str]:
        """What the template puts between the generation prompt and a call (Qwen3: an empty
        thinking section), and the text every call (to `name`, if given) opens with."""

        def render(fn: str, args: dict) -> str:
            function = {"name": fn, "arguments": args}
            call = {"id": self._probe_id(fn), "type": "function", "function": function}
            turn = {"role": "assistant", "content": "", "tool_calls": [call]}
            return render_text(
                self.tok, [*messages, turn], tools=tools, add_generation_prompt=False, **kwargs
            )

        if name is None:
            a, b = render("a_", {}), render("b_", {"x_": "y"})
        else:
            a, b = render(name, {}), render(name, {"x_": "y"})
        base = render_text(self.tok, messages, tools=tools, add_generation_prompt=False, **kwargs)
        shared = os.path.commonprefix([a, b])
        start = self.tok.tool_call_start
        at = shared.rfind(start)
        # End before the last whitespace: the model writes the next word with its leading
        # space itself, as unforced (no token boundary inside a word); a format that puts a
        # marker right after the name (GLM's, Mistral's, Gemma's) ends after the name.
        end = max(shared.rfind(" "), shared.rfind("\n"), shared.rfind("\t"), at + len(start))
        if name and name not in shared[at:end]:
            named = re.search(rf"{re.escape(name)}(?=[^A-Za-z0-9_-])", shared[at:])
            end = at + named.end() if named else end
        if at < len(os.path.commonprefix([a, base])) or (
            name and not re.search(rf"{re.escape(name)}(?![A-Za-z0-9_-])", shared[at:end])
        ):
            raise invalid(
                "tool_choice",
                "this model's chat template does not open a tool call "
                f"with a fixed text{' naming the function' if name else ''}, so "
                f'tool_choice {name or "required"!r} cannot be honoured; use "auto"',
                "unsupported_parameter",
            )
        prompt = render_text(self.tok, messages, tools=tools, **kwargs)
        lead = shared[len(prompt) : at] if shared.startswith(prompt) and at >= len(prompt) else ""
        return lead, shared[at:end]


def _names_its_role(m: dict) -> bool:
    name = m.get("name")
    return m["role"] != "tool" and isinstance(name, str) and name.strip().lower() == m["role"]


def _unnamed(m: dict) -> dict:
    return {k: v for k, v in m.items() if k != "name"}


def _folded(m: dict) -> dict:
    """The message with its participant name written before its text."""
    if not m.get("name"):
        return m
    out = _unnamed(m)
    out["content"] = f"{m['name']}: {m['content']}" if m["content"] else m["content"]
    return out
