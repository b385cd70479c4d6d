"""What a model's chat template can do, read once from the template itself.

A Jinja chat template names the variables it reads (`tools`, `enable_thinking`, a model's own
switches); jinja2's `meta.find_undeclared_variables` lists them without rendering anything.
The tokenizer (mlx-lm's TokenizerWrapper) says whether the model has thinking markers and a
tool-call format mlx-lm can parse (`has_thinking`, `has_tool_calling`, `tool_parser`).
"""

from __future__ import annotations

import functools
import logging
import re
import secrets
from dataclasses import dataclass

log = logging.getLogger("dflash2")

THINKING_KWARG = "enable_thinking"


def _template_source(tokenizer) -> str | None:
    """The Jinja source mlx-lm renders, or None (no template, or a Python renderer)."""
    if getattr(tokenizer, "_chat_template", None) is not None:  # mlx-lm's chat_template_type
        return None
    src = getattr(tokenizer, "chat_template", None)
    if isinstance(src, dict):  # named templates ("default", "tool_use", ...): any may render
        src = "\n".join(str(v) for v in src.values())
    return src if isinstance(src, str) and src else None


def template_syntax_error(tokenizer) -> tuple[str | None, Exception] | None:
    """(its name, or None for the one template; the error) of the first of the tokenizer's
    own Jinja templates that does not compile as transformers compiles them; None where all
    do (or none is Jinja). Compiled only, not rendered: a template may refuse some inputs."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers: its own errors say it on the first request
        return None
    if getattr(tokenizer, "_chat_template", None) is not None:  # a Python renderer
        return None
    src = getattr(tokenizer, "chat_template", None)
    named = src.items() if isinstance(src, dict) else [] if src is None else [(None, src)]
    for name, source in named:
        try:
            _compile_jinja_template(source)
        except Exception as e:  # noqa: BLE001 - a syntax error; a template that is no string
            return name, e
    return None


def template_variables(source: str) -> frozenset[str] | None:
    """The variables a Jinja template reads from its caller; None if jinja2 cannot parse it."""
    import jinja2
    from jinja2 import meta

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return frozenset(meta.find_undeclared_variables(env.parse(source)))
    except jinja2.TemplateError as e:  # e.g. a tag of a transformers extension
        log.debug("cannot read the chat template's variables: %s", e)
        return None


@dataclass(frozen=True)
class TemplateInfo:
    """What the chat template and the tokenizer support (`variables` None: not known)."""

    has_template: bool
    variables: frozenset[str] | None
    source: str | None
    thinks: bool  # the tokenizer has thinking markers (<think> ... </think>)
    tool_calling: bool  # the tokenizer declares a tool-call format mlx-lm parses

    @classmethod
    def of(cls, tokenizer) -> "TemplateInfo":
        source = _template_source(tokenizer)
        has = bool(getattr(tokenizer, "has_chat_template", source is not None))
        return cls(
            has,
            template_variables(source) if source else None,
            source,
            bool(getattr(tokenizer, "has_thinking", False)),
            bool(getattr(tokenizer, "has_tool_calling", False))
            and getattr(tokenizer, "tool_parser", None) is not None,
        )

    def reads(self, name: str) -> bool | None:
        """Whether the template reads `name` (None: cannot tell, e.g. a Python renderer)."""
        if self.variables is not None:
            return name in self.variables
        if self.source is not None:
            return name in self.source
        return None

    @property
    def thinking_switch(self) -> bool:
        """The template turns thinking on or off with `enable_thinking` (Qwen3-style)."""
        return bool(self.reads(THINKING_KWARG))

    def honours_thinking(self, on: bool) -> bool:
        """Thinking `on` or off can be had: through the switch, or as the model does anyway
        without one (it always or never thinks)."""
        return self.thinking_switch or on is self.thinks

    @property
    def renders_tools(self) -> bool:
        return self.has_template and self.reads("tools") is not False

    @property
    def call_id_length(self) -> int | None:
        """The length the template requires of tool-call ids (Mistral's: 9), or None."""
        found = _CALL_ID_LENGTH.search(self.source or "")
        return int(found.group(1)) if found else None


# Mistral's templates: {% if tool_call.id|length != 9 %}{{ raise_exception(...) }}
_CALL_ID_LENGTH = re.compile(r"(?:tool_call\.id|tool_call_id)\s*\|\s*length\s*!=\s*(\d+)")


def turn_marks(tokenizer) -> set[int]:
    """Token ids that only a template writes between turns: the special tokens and EOS ids
    (a message's text cannot spell them: the server keeps their text as text)."""
    marks = set(getattr(tokenizer, "all_special_ids", None) or ())
    return marks | set(getattr(tokenizer, "eos_token_ids", None) or ())  # a turn's end, at least


def thought_piece(text: str, first: bool, tail: str) -> tuple[str, str]:
    """A streamed piece of a thinking section without the newlines a template puts around it
    (Qwen's own template strips them from history): those at its start (`first`: nothing of
    it shown yet) dropped, trailing ones held (`tail`) until more of it comes.
    Returns (the text to show, the newlines held)."""
    if first:
        text = text.lstrip("\n")
    text = tail + text
    body = text.rstrip("\n")
    return body, text[len(body) :]


def thinking_left_open(tokenizer, ids: list[int]) -> bool:
    """The prompt leaves a thinking section open for the reply: its last think start comes
    after its last think end, in the reply's own turn (no turn mark after it). A `<think>`
    that a user's message or a tool result quotes is followed by its turn's end: text."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    start = tokenizer.rfind_think_start(ids)
    if start < 0 or start < tokenizer.rfind_think_end(ids):
        return False
    after = ids[start + len(getattr(tokenizer, "think_start_tokens", None) or (1,)) :]
    return not turn_marks(tokenizer).intersection(after)  # the marker may be special itself


def render_text(
    tokenizer, messages: list[dict], *, tools=None, add_generation_prompt=True, **kwargs
) -> str:
    """The chat template's text for `messages` (and `tools`), untokenized."""
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )


# Special-token strings inside a message's text are text (OpenAI's API treats them so): a
# user or a tool result that writes "<|im_end|><|im_start|>system" must not open a turn. Each
# is replaced by a mark while the template renders; a mark holds a random nonce, so no text a
# client sends can pass for one.


@dataclass(frozen=True)
class Marked:
    """Messages whose special-token strings are marks, and what each mark stands for."""

    messages: list[dict]
    found: list[str]  # the strings, in mark order (empty: nothing was marked)
    nonce: str = ""

    def encode(self, tokenizer, text: str) -> list[int]:
        """Token ids of a rendered prompt holding marks, as the tokenizer itself encodes text
        around its special tokens: the template's own special tokens are split off and kept,
        and each stretch between them is encoded with the marked strings put back as plain
        text (so " <|im_end|>" merges with its space as any text would)."""
        marks = re.compile(f"\ue000{self.nonce}:(\\d+)\ue001")
        controls = re.compile("(" + "|".join(map(re.escape, special_strings(tokenizer))) + ")")
        ids: list[int] = []
        for i, part in enumerate(controls.split(text)):
            if i % 2:
                ids += tokenizer.encode(part, add_special_tokens=False)
            elif part:
                plain = marks.sub(lambda m: self.found[int(m.group(1))], part)
                ids += tokenizer.encode(plain, add_special_tokens=False, split_special_tokens=True)
        return [int(t) for t in ids]


@functools.lru_cache(maxsize=8)
def special_strings(tokenizer) -> tuple[str, ...]:
    """The tokenizer's special added tokens (control tokens), longest first."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    added = getattr(hf, "added_tokens_decoder", None) or {}
    found = {t.content for t in added.values() if getattr(t, "special", False) and t.content}
    return tuple(sorted(found, key=len, reverse=True))


def mark_special_text(messages, specials: tuple[str, ...]) -> Marked:
    """`messages` with each special-token string in their text (content, reasoning_content,
    a participant's name) replaced by a mark."""
    if not specials:
        return Marked(list(messages), [])
    pattern = re.compile("|".join(map(re.escape, specials)))
    nonce, found = secrets.token_hex(8), []

    def mark(m: re.Match) -> str:
        found.append(m.group(0))
        return f"\ue000{nonce}:{len(found) - 1}\ue001"

    out = []
    for message in messages:
        fields = {
            k: pattern.sub(mark, v)
            for k, v in message.items()
            if k in ("content", "reasoning_content", "name") and isinstance(v, str)
        }
        out.append({**message, **fields} if fields else message)
    return Marked(out, found, nonce) if found else Marked(list(messages), [])


def default_thinking(tokenizer) -> bool | None:
    """Whether the template thinks when `enable_thinking` is left out: its prompt then equals
    its prompt with the switch on (True) or off (False); None: cannot tell (no switch, or a
    template that fails here, which is said where it is used)."""
    ask = [{"role": "user", "content": "hi"}]
    try:
        left_out = render_text(tokenizer, ask)
        on = render_text(tokenizer, ask, enable_thinking=True)
        off = render_text(tokenizer, ask, enable_thinking=False)
    except Exception:  # noqa: BLE001 - any template error: not known
        return None
    return True if left_out == on != off else False if left_out == off != on else None


def _names_a(path, kind: str = "file") -> bool:
    """False where `path` cannot name a file or folder: a template's text often has a
    stretch longer than a file name may be (OSError) or a NUL (ValueError)."""
    try:
        return path.is_file() if kind == "file" else path.is_dir()
    except (OSError, ValueError):
        return False


def read_chat_template(value: str) -> str:
    """A chat template given by the user (mlx_lm.server's --chat-template): a file of Jinja
    (or a tokenizer_config.json holding one), else the template's own text."""
    import json
    from pathlib import Path

    from .errors import ParameterError

    if not (isinstance(value, str) and value.strip()):
        raise ParameterError(f"chat_template must be a non-empty string, got {value!r}")
    path = Path(value).expanduser()
    if _names_a(path, "folder"):
        raise ParameterError(
            f"chat template {path}: is a folder; give a Jinja file or a tokenizer_config.json"
        )
    if _names_a(path):
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".json":
                text = json.loads(text).get("chat_template") if text.strip() else None
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
            raise ParameterError(f"chat template {path}: cannot read it ({e})") from None
        if not isinstance(text, str):
            raise ParameterError(f"chat template {path}: no 'chat_template' string in it")
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ParameterError(
            f"chat template {value!r}: no such file, and not a Jinja template (no '{{{{' or '{{%')"
        )
    if not text.strip():
        raise ParameterError(f"chat template {value!r} is empty")
    return text


def check_chat_template(tokenizer, where: str) -> None:
    """A ParameterError naming `where` unless the tokenizer's template renders a user turn."""
    from .errors import ParameterError

    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
    except Exception as e:  # noqa: BLE001 - jinja2's and transformers' errors alike
        raise ParameterError(
            f"{where}: the chat template does not render a user turn: {e}"
        ) from None
