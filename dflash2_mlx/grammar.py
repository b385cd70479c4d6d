"""Grammars over the target's tokens (via llguidance) as engine constraints.

`Grammars(tokenizer, vocab, stop_ids)` compiles a reply grammar into a `Grammar`, the factory a
generation's `GenerationParams.constraint` takes: a JSON value a schema accepts, and/or tool
calls whose arguments follow their schemas (`Calls`), after an optional thinking section
(`Thinking`). Each generation gets its own matcher (`GrammarConstraint`), which says which
tokens may come next after each prefix of a round's drafts (engine/constraint.py) and follows
the committed tokens. Once the reply is complete only the stop tokens are allowed, so a
constrained generation ends by itself.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .errors import ParameterError
from .json_schema import check_patterns_at_once, check_refs, closed_objects, without_format
from .schema_ends import check_can_end

log = logging.getLogger("dflash2")

# Whitespace between JSON tokens, at most this many characters in a row: pretty-printing
# fits, and a small model cannot loop on newlines until max_tokens.
_SPACE = r"[\x20\x0A\x0D\x09]"
_WHITESPACE = _SPACE + "{0,32}"
ANY_OBJECT: dict = {"type": "object"}
# characters a Lark regex literal (/.../) cannot hold as themselves
_REGEX_ESCAPES = {"/": "\\/", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


# llguidance's own limits (a parser row past 2000 items, too many expressions, ...)
_LIMIT = re.compile(r"max is \d+|too many", re.IGNORECASE)


def _beyond_limits(error: str | None) -> ParameterError:
    return ParameterError(
        "the reply's schema (response_format, or the parameters of tools held to theirs: "
        "strict, or under a forced tool_choice) is beyond what the grammar engine can follow: "
        f"{_brief(error or '')}; simplify it (fewer tools, or a shorter repetition count in a "
        "pattern, say)"
    )


class OpeningRefused(ParameterError):
    """A forced call's opening, written by the prompt, that the reply grammar refuses (its
    tool name tokenizes otherwise there, say)."""


def _brief(error: str) -> str:
    """llguidance's error without the parser state it dumps after the first line; where that
    line only opens the message ("regex parse error:"), with the line saying what is wrong."""
    lines = error.strip().splitlines() or [error]
    first = lines[0]
    if first.rstrip().endswith(":"):
        cause = next((x.strip() for x in lines[1:] if x.strip().startswith("error:")), None)
        if cause:
            first = f"{first.rstrip()} {cause.removeprefix('error:').strip()}"
    return first if len(first) <= 300 else first[:300] + "…"


def _checked(value: dict | None, calls: Calls | None) -> dict | None:
    """`value` closed (json_schema.closed_objects) once it and the tools' schemas pass the
    checks made before llguidance (which would take minutes and gigabytes over some)."""
    try:
        for schema in [value, *(args for _, args in calls.tools if args)] if calls else [value]:
            check_patterns_at_once(schema)
            check_can_end(schema)
        return None if value is None else closed_objects(value)
    except ValueError as e:
        raise ParameterError(f"unsupported JSON schema: {e}") from None
    except RecursionError:  # hundreds of levels: objects in objects, or $refs in a chain
        raise ParameterError(
            "unsupported JSON schema: it nests too deep (hundreds of levels of schemas or $refs)"
        ) from None


class Grammars:
    """Compiles grammars for one tokenizer (its llguidance view is built once, on first use:
    ~1 s for a 50k vocabulary)."""

    def __init__(self, tokenizer, vocab: int, stop_ids: Sequence[int]):
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        wrapped = isinstance(tokenizer, TokenizerWrapper)  # mlx-lm's wraps the HF tokenizer
        self._hf = tokenizer._tokenizer if wrapped else tokenizer
        self.vocab, self.stop_ids = int(vocab), tuple(sorted(int(i) for i in stop_ids))
        self._ll = None

    def _tokenizer(self):
        if self._ll is None:
            if not self.stop_ids:
                raise ParameterError("constrained generation needs the model's stop token ids")
            try:
                self._ll = _ll_tokenizer(self._hf, self.vocab, list(self.stop_ids))
            except Exception as e:
                raise ParameterError(
                    f"constrained generation is not available for this tokenizer "
                    f"({type(self._hf).__name__}): {e}"
                ) from None
        return self._ll

    def json_schema(self, schema: dict | None = None, thinking: Thinking | None = None) -> Grammar:
        """The grammar of JSON values `schema` accepts (None: any JSON object), after a
        thinking section where `thinking` says there may be one."""
        return self.reply(ANY_OBJECT if schema is None else schema, None, thinking)

    def reply(
        self, value: dict | None, calls: Calls | None = None, thinking: Thinking | None = None
    ) -> Grammar:
        """The grammar of a reply: a JSON value `value` accepts, or tool calls (`calls`), or
        either (with no value, free text or text followed by calls), after a thinking section
        where `thinking` says there may be one. A schema llguidance cannot compile raises
        ParameterError with its reason."""
        from llguidance import LLMatcher

        if value is None and calls is None:
            raise ValueError("a reply grammar needs a value schema or tool calls")
        value = _checked(value, calls)
        while True:
            try:
                if calls is None and thinking is None:
                    source = LLMatcher.grammar_from_json_schema(
                        json.dumps(value), overrides={"whitespace_pattern": _WHITESPACE}
                    )
                else:
                    lark = _reply_lark(value, calls, thinking, self._marker)
                    source = LLMatcher.grammar_from_lark(lark)
            except (TypeError, ValueError) as e:
                raise ParameterError(f"invalid JSON schema: {e}") from None
            matcher = LLMatcher(self._tokenizer(), source, log_level=0)
            # a format it does not know is a note, as JSON Schema says (pydantic's SecretStr
            # writes "password", Path "path"): the string goes unchecked, not the request refused
            unknown = re.search(r"Unknown format: (\S+)", matcher.get_error() or "")
            plain = None if not unknown or value is None else without_format(value, unknown[1])
            if plain is None or plain == value:
                break
            value = plain
        if matcher.get_error():
            why = _brief(matcher.get_error())
            if "uniqueItems" in why:  # pydantic writes it for a set
                why += " (no grammar can hold items unique: send an array without it, a list)"
            raise ParameterError(f"unsupported JSON schema: {why}")
        if calls is not None and calls.opened and not matcher.consume_tokens(list(calls.opened)):
            log.debug("the call the prompt opened is refused: %s", matcher.get_error())
            # its first line: every refusal's state dump ends "Stop: ParserTooComplex"
            if _LIMIT.search((matcher.get_error() or "").split("\n", 1)[0]):  # many tools
                raise _beyond_limits(matcher.get_error())
            raise OpeningRefused("the call the prompt opened is not one the grammar allows")
        grammar = Grammar(matcher, frozenset(self.stop_ids))
        if grammar().stuck():  # e.g. {"$ref": "#"}: it would "finish" at once with nothing
            raise ParameterError("unsupported JSON schema: no value satisfies it")
        return grammar

    def _marker(self, text: str) -> str:
        """A marker as the grammar writes it: the token, when the tokenizer holds it as one
        token llguidance counts as special (Qwen's <think>, <tool_call>: text cannot spell
        it), else the literal text."""
        ll = self._tokenizer()
        ids = ll.tokenize_str(text)
        return (
            f"<[{ids[0]}]>" if len(ids) == 1 and ll.is_special_token(ids[0]) else json.dumps(text)
        )


@dataclass(frozen=True)
class Thinking:
    """A thinking section before the reply: free text between the model's markers.
    `opened`: the prompt already opened it (the reply starts inside it); else the model may
    open one or answer at once."""

    start: str
    end: str
    opened: bool = False


@dataclass(frozen=True)
class Calls:
    """Tool calls in mlx-lm's json_tools format (Qwen's, Hermes'): `opener {"name": ...,
    "arguments": {...}} closer`. `tools`: (name, arguments schema or None: any object) for
    every tool the reply may call; `parallel`: more than one call."""

    opener: str
    closer: str
    tools: tuple[tuple[str, dict | None], ...]
    parallel: bool = True
    # The prompt already opened the first call with these tokens (a forced tool_choice): the
    # reply goes on from inside it, and there is no value or text beside the calls.
    opened: tuple[int, ...] = ()

    def schemas(self) -> list[dict]:
        """Each tool's call object, its arguments' `$defs` moved to the root (where their
        `#/$defs/...` references point)."""
        out = []
        for name, args in self.tools:
            args = dict(closed_objects(args or ANY_OBJECT))
            defs = {k: args.pop(k) for k in ("$defs", "definitions") if k in args}
            check_refs(name, args)
            call = {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": args},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            out.append({**call, **defs})
        return out


def _json(schema: dict) -> str:
    """`%json` of a schema (inline in Lark), with the whitespace limit."""
    if not isinstance(schema, dict):
        raise TypeError(f"a JSON schema is an object, got {type(schema).__name__}")
    options = {**schema.get("x-guidance", {}), "whitespace_pattern": _WHITESPACE}
    return "%json " + json.dumps({**schema, "x-guidance": options})


def _reply_lark(value: dict | None, calls: Calls | None, thinking: Thinking | None, marker) -> str:
    """The reply grammar in llguidance's Lark dialect: [thinking] whitespace, then the value,
    or calls (text before them when there is no value: text alone or text then calls), then
    whitespace. `marker(text)`: how a marker is written (see Grammars._marker)."""
    head = "" if thinking is None else ("rest " if thinking.opened else "section? ")
    if calls is None:
        reply = "value"
    elif calls.opened:
        reply = "made"
    else:
        reply = "value | made" if value is not None else "TEXT | made"
    lines = [f"start: {head}GAP? ({reply}) GAP?", f"GAP: /{_SPACE}{{1,32}}/"]
    if value is not None:
        lines.append(f"value: {_json(value)}")
    if calls is not None:
        lines += _call_rules(calls, value is not None, marker)
    if thinking is not None:
        lines += _thinking_rules(thinking, marker)
    return "\n".join(lines)


def _text_until(rule: str, written: str) -> list[str]:
    """`rule`: any text, then a marker as the grammar writes it (`written`). A special token
    ends plain text by itself; a literal marker ends a lazy lexeme."""
    if written.startswith("<["):
        return [f"{rule}: {rule.upper()}_TEXT {written}", f"{rule.upper()}_TEXT: /(?s:.*)/"]
    return [f"{rule}[suffix={written}]: /(?s:.*)/"]


def _thinking_rules(thinking: Thinking, marker) -> list[str]:
    rules = _text_until("rest", marker(thinking.end))
    if not thinking.opened:
        rules.append(f"section: {marker(thinking.start)} rest")
    return rules


def _call_rules(calls: Calls, with_value: bool, marker) -> list[str]:
    opener, closer = marker(calls.opener), marker(calls.closer)
    more = " more" if calls.parallel else ""
    names = [f"call_{i}" for i in range(len(calls.tools))]
    rules = [f"call: GAP? ({' | '.join(names)}) GAP? {closer}"]
    rules += [f"{n}: {_json(schema)}" for n, schema in zip(names, calls.schemas())]
    if calls.parallel:
        rules.append(f"more: (GAP? {opener} call)*")
    if with_value or calls.opened:  # (text before a call would shadow the value's lexemes)
        return rules + [f"made: {opener} call{more}"]
    rules += _text_until("pre", opener) + [f"made: pre call{more}"]
    if opener.startswith("<["):  # text cannot spell the opener
        return rules + ["TEXT: /(?s:.*)/"]
    # a reply without a call: text that does not contain the opener
    escaped = "".join(_REGEX_ESCAPES.get(ch, re.escape(ch)) for ch in calls.opener)
    return rules + [f"TEXT: /(?s:.*)/ & ~/(?s:.*{escaped}.*)/"]


def _ll_tokenizer(hf, vocab: int, stop_ids: list[int]):
    """llguidance's view of the tokenizer: from its Rust definition (exact for byte-level and
    byte-fallback tokenizers), else, for a decoder llguidance does not read (e.g. a
    character-level one), from each token's own text, with a warning: that view is exact only
    where every token decodes alone to its own bytes."""
    import llguidance
    import llguidance.hf

    try:
        return llguidance.hf.from_tokenizer(hf, n_vocab=vocab, eos_token=stop_ids)
    except Exception as e:
        log.warning("llguidance cannot read this tokenizer (%s): using each token's text", e)
        pieces = _Pieces(hf, vocab, stop_ids)
        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(pieces), n_vocab=vocab, eos_token=stop_ids
        )


class _Pieces:
    """A tokenizer as llguidance's TokenizerWrapper reads it: every token's bytes, the special
    ids, and encoding (the tokenizer's own, else longest pieces first where it has no token
    for a piece, as a word-level one)."""

    def __init__(self, hf, vocab: int, stop_ids: list[int]):
        self.hf, self.unk = hf, getattr(hf, "unk_token_id", None)
        self.eos_token_id, self.bos_token_id = stop_ids[0], None
        self.special_token_ids = sorted(set(getattr(hf, "all_special_ids", ())) | set(stop_ids))
        known = min(vocab, len(hf))
        self.tokens = [hf.decode([i]).encode() for i in range(known)] + [b""] * (vocab - known)
        special = set(self.special_token_ids)
        self._ids = {t: i for i, t in enumerate(self.tokens) if t and i not in special}
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # so llguidance hands over text, not bytes
            raise TypeError("encodes text only")
        ids = self.hf.encode(text, add_special_tokens=False)
        return ids if self.unk is None or self.unk not in ids else self._greedy(text.encode())

    def _greedy(self, data: bytes) -> list[int]:
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                if data[i : i + n] in self._ids:
                    out.append(self._ids[data[i : i + n]])
                    i += n
                    break
            else:
                raise ValueError(f"no token spells {data[i : i + 1]!r}")
        return out


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar (`GenerationParams.constraint`): each call starts one generation's
    matcher, a copy of the checked one. `stop_ids`: what a finished value allows, so the
    generation must stop on them (the engine checks)."""

    matcher: Any  # llguidance.LLMatcher at the start, never advanced
    stop_ids: frozenset[int]

    def __call__(self) -> GrammarConstraint:
        return GrammarConstraint(self.matcher.deep_copy(), self.stop_ids)


class GrammarConstraint:
    """One generation's position in its grammar (engine/constraint.py TokenConstraint)."""

    def __init__(self, matcher, stop_ids: frozenset[int]):
        self.matcher, self.stop_ids = matcher, stop_ids

    def _mask(self, matcher=None) -> np.ndarray:
        matcher = self.matcher if matcher is None else matcher
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little").astype(bool)

    def allowed(self, drafts: Sequence[int]) -> np.ndarray:
        """Walks the drafts while each is allowed, on a copy of the matcher (a few microseconds):
        after llguidance's rollback a later mask could allow a token it then refused. A stop
        token ends the walk: the generation ends there. A token the mask allows but the
        matcher refuses is taken out of that row, so it is never chosen."""
        walker = self.matcher.deep_copy()
        rows = [self._mask()]
        for t in drafts:
            if t in self.stop_ids or not rows[-1][t]:
                break
            if not walker.consume_token(int(t)):
                log.warning(
                    "grammar: token %d was allowed, then refused: %s", t, walker.get_error()
                )
                rows[-1][t] = False
                break
            rows.append(self._mask(walker))
        rows += [rows[-1]] * (len(drafts) + 1 - len(rows))  # past a forbidden draft: unused
        return np.stack(rows)

    def forced(self) -> list[int]:
        return self.matcher.compute_ff_tokens()

    def stuck(self) -> bool:
        """Nothing but a stop token is allowed, yet the value is incomplete (llguidance then
        allows the stop: a $ref cycle with no base case, a key the tokenizer cannot spell)."""
        mask = self._mask()
        mask[[t for t in self.stop_ids if t < len(mask)]] = False
        return not self.matcher.is_accepting() and not mask.any()

    def commit(self, tokens: Sequence[int]) -> None:
        if tokens and not self.matcher.consume_tokens([int(t) for t in tokens]):
            # tokens its own mask allowed: llguidance ran past a limit of its own (a pattern
            # such as a{100000} compiles, then "too many expressions constructed")
            log.debug("grammar: committed tokens were refused: %s", self.matcher.get_error())
            raise _beyond_limits(self.matcher.get_error())

    def on_stop(self) -> None:
        """A stop token ended the reply: only where the value is complete, else the grammar
        was stuck (llguidance allows the stop there) and the cut value is an error, not a
        finished reply."""
        if not self.matcher.is_accepting():
            raise ParameterError(
                "the reply's schema (response_format, or a tool's parameters held to it: "
                "strict, or under a forced tool_choice) admits no "
                "complete value from where the reply got to (a $ref cycle with no base case, "
                "or a key or pattern this model's tokens cannot spell)"
            )
