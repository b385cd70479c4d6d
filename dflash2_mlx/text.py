"""Text in, text out: chat templates, streaming detokenization and stop strings.

Shared by the chat front end and the server, so both stop, count and report identically.
"""

from __future__ import annotations

import codecs
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

from .chat_template import mark_special_text, special_strings
from .engine.events import GenerationStats, RoundEvent
from .engine.generation import GenerationParams, token_ids
from .engine.session import Session
from .errors import ParameterError
from .token_bytes import incomplete_tail, knows_token_bytes, token_bytes, trims_first_space


# transformers warns (on stderr, once per tokenizer) when a text passes the tokenizer's
# model_max_length. Front ends that measure the prompt against the model's context themselves
# (chat, serve) and refuse it in one line tokenize inside quiet_length_warning(), so that
# warning does not come first, in another voice.
_TOO_LONG = "Token indices sequence length is longer than the specified maximum"
_TOKENIZER_LOG = "transformers.tokenization_utils_base"


class _DropTooLong(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TOO_LONG)


@contextmanager
def quiet_length_warning():
    """Drops that one warning while inside; any other tokenizer message still shows."""
    logger, drop = logging.getLogger(_TOKENIZER_LOG), _DropTooLong()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def chat_prompt_ids(
    tokenizer,
    messages: Sequence[dict],
    *,
    thinking: bool | None = None,
    add_generation_prompt: bool = True,
    tools: Sequence[dict] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of `messages` under the model's chat template.

    `thinking` is passed as `enable_thinking` (Qwen3-style templates) when not None; `tools`
    (OpenAI function tools) and `template_kwargs` go to the template as they are.
    """
    if not messages:
        raise ParameterError("messages is empty: at least one message is needed")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise ParameterError(
                f"messages[{i}] must be an object with a 'role' and a string 'content'"
            )
    # special-token strings in the messages' text stay text (chat_template.py)
    marked = mark_special_text(messages, special_strings(tokenizer))
    messages, found = marked.messages, marked.found
    if not getattr(tokenizer, "chat_template", None):
        if tools:
            raise ParameterError("tools need a chat template; this model has none")
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        text += "\nassistant:" if add_generation_prompt else ""
        if found:  # what encode() adds to any text (a BOS), then the marked text
            return list(tokenizer.encode("")) + marked.encode(tokenizer, text)
        return list(tokenizer.encode(text))
    kwargs: dict[str, Any] = dict(template_kwargs or {})
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    if tools:
        kwargs["tools"] = list(tools)
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=add_generation_prompt, tokenize=not found, **kwargs
    )
    if found:
        return marked.encode(tokenizer, ids)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


@dataclass
class TextChunk:
    """What one round added: new text (after stop-string handling) and the raw event."""

    text: str
    event: RoundEvent
    finish_reason: str | None = None  # "stop" (EOS or stop string) | "length" | None
    stop: str | None = None  # the stop string that ended the text, if one did


@dataclass
class TextResult:
    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list = field(default_factory=list)  # with GenerationParams.logprobs: one a token
    # with GenerationParams.prompt_logprobs: one per prompt token after the first
    prompt_logprobs: list | None = None


class IncrementalDecoder:
    """The text of generated ids exactly as the tokenizer decodes them after the prompt.

    Each `add` decodes a short window (the ids of the previous add as context, then the new
    ones) and returns what the new ones add to it. Streaming detokenizers that start from
    nothing drop the first token's leading space (" Paris" -> "Paris"); the context keeps it.
    The ids of a UTF-8 character not yet complete are held back until it is: found from the
    tokens' bytes where the vocabulary gives them, else from a window's trailing U+FFFD.
    Invalid bytes are U+FFFD as in the bytes' own decode (_window).
    """

    CONTEXT = 4  # prompt ids seeding the first window
    UTF8_MAX = 4  # ids an incomplete character can span (one byte each at most)

    def __init__(self, tokenizer, context: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.ids = [int(t) for t in context][-self.CONTEXT :]
        self.start = 0  # window start: the context of the next add
        self.read = len(self.ids)  # ids up to here are shown
        self.text = ""  # everything returned so far
        self.byte_level = knows_token_bytes(tokenizer)

    def _decode(self, ids: list[int]) -> str:
        try:
            return self.tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        except TypeError:  # a tokenizer without HF's keyword arguments
            return self.tokenizer.decode(ids)

    def _whole(self, end: int) -> int:
        """The end of the ids before `end` that leave no character incomplete (from the bytes
        of the last UTF8_MAX tokens: each adds one byte at least). The window reaches into the
        shown ids: a prompt may end inside a character that the reply completes."""
        first = max(self.start, end - self.UTF8_MAX)
        parts = [token_bytes(self.tokenizer, t) for t in self.ids[first:end]]
        missing = incomplete_tail(b"".join(parts))
        while missing > 0 and end > self.read:
            missing -= len(parts.pop())
            end -= 1
        return end

    def _whole_by_text(self, end: int, full: str) -> tuple[int, str]:
        """As _whole, for a vocabulary without bytes: ids that end in U+FFFD are held, up to
        UTF8_MAX of them (more that never complete a character are invalid bytes, shown)."""
        if not full.endswith("\ufffd"):
            return end, full
        for held in range(1, min(self.UTF8_MAX, end - self.read) + 1):
            text = self._decode(self.ids[self.start : end - held])
            if not text.endswith("\ufffd"):
                return end - held, text
        return end, full

    def add(self, tokens: Sequence[int], final: bool = False) -> str:
        self.ids.extend(int(t) for t in tokens)
        if self.byte_level:
            whole = self._whole(len(self.ids))
            new = self._window(whole) if whole > self.read else ""
            if final and whole < len(self.ids):  # cut inside a character: U+FFFD, by bytes
                new += self._window(len(self.ids), by_bytes=True)
        else:
            new = self._by_text(final)
        self.text += new
        return new

    def _window(self, end: int, by_bytes: bool = False) -> str:
        """What ids[read:end] add to the window's text. Where that holds U+FFFD, or the window
        rewrites text shown before (a byte-fallback vocabulary's decode turns a whole run of
        byte tokens into U+FFFD when one of them is invalid), their own bytes are decoded
        instead, as mlx-lm's detokenizers do: shown text is never sent again, and the text
        does not depend on how the ids came in rounds."""
        full = shown = ""
        if not by_bytes:
            full = self._decode(self.ids[self.start : end])
            shown = self._decode(self.ids[self.start : self.read])
        if by_bytes or not (full.startswith(shown) and "\ufffd" not in full[len(shown) :]):
            # (from the common prefix: a prompt may end inside a character the reply ends)
            full = self.bytes_text(self.ids[self.start : end])
            shown = self.bytes_text(self.ids[self.start : self.read])
            if self.start == 0 and trims_first_space(self.tokenizer):  # as its decode does
                full, shown = full.removeprefix(" "), shown.removeprefix(" ")
        self.start, self.read = self.read, end
        return full[len(os.path.commonprefix([shown, full])) :]

    def start_of(self, token: int) -> int:
        """Where `token`'s own text will start in `text` once added: after the characters
        shown and those held back with an unfinished one, and after that one's U+FFFD where
        the token's first byte cannot go on with it (at its start where it does)."""
        held = b"".join(token_bytes(self.tokenizer, t) for t in self.ids[self.read :])
        if not held:
            return len(self.text)
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        start = len(self.text) + len(utf8.decode(held))  # whole characters held with it
        rest = utf8.getstate()[0]
        first = token_bytes(self.tokenizer, token)[:1]
        if rest and first and utf8.decode(first).startswith("\ufffd"):
            start += len(rest.decode("utf-8", "replace"))
        return start

    def bytes_text(self, ids: list[int]) -> str:
        """The text of `ids`' own bytes (invalid ones U+FFFD, as mlx-lm's detokenizers)."""
        data = b"".join(token_bytes(self.tokenizer, t) for t in ids)
        return data.decode("utf-8", errors="replace")

    def _by_text(self, final: bool) -> str:
        """add's text for a vocabulary without bytes."""
        end = len(self.ids)
        if end == self.read:
            return ""
        full = self._decode(self.ids[self.start : end])
        if not final:
            end, full = self._whole_by_text(end, full)
            if end == self.read:
                return ""
        shown = self._decode(self.ids[self.start : self.read])
        common = len(shown) if full.startswith(shown) else len(os.path.commonprefix([shown, full]))
        self.start, self.read = self.read, end
        return full[common:]


class TextStream:
    """Turns round events into text, cutting at the first stop string (never emitted).

    Text that could be the start of a stop string is held back until it is decided. A stop
    string never matches part of an added token's text (`<think>`, `<tool_call>`: a stop "i"
    would leave "<th" as the answer); it may match the whole of one.
    `context`: the prompt ids (the text continues them: a leading space is kept).
    """

    def __init__(self, tokenizer, stop: Sequence[str] = (), context: Sequence[int] = ()):
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise ParameterError(f"stop must be a string or a list of strings, got {stop!r}")
        if "" in stop:  # it would match everywhere: refused, as the server does
            raise ParameterError(f"stop strings must not be empty, got {list(stop)!r}")
        self.stop = list(stop)
        self.markers = _added_token_texts(tokenizer) if stop else {}
        self.spans: list[tuple[int, int]] = []  # where the markers lie in the decoded text
        self.decoder = IncrementalDecoder(tokenizer, context)
        self.sent = 0  # chars of the decoded text already emitted
        self.stopped = False
        self.hit: str | None = None  # the stop string found
        self.used = 0  # tokens of the last feed up to the one that completed the stop string

    def feed(self, tokens: list[int], final: bool) -> tuple[str, bool]:
        """Add tokens; return (text safe to emit now, hit a stop string). The tokens are
        decoded one at a time, so a round of several ends where plain decoding would: at the
        first token that completes a stop string (the earliest of those it completes)."""
        steps = [[t] for t in tokens] if self.stop else [list(tokens)]  # no stops: one go
        for k, step in enumerate(steps or [[]]):
            self.decoder.add(step, final and k == max(len(steps), 1) - 1)
            text = self.decoder.text
            marker = self.markers.get(step[0]) if step else None
            if marker and text.endswith(marker):
                self.spans.append((len(text) - len(marker), len(text)))
            found = [(self._find(text, s, max(0, self.sent - len(s) + 1)), s) for s in self.stop]
            found = [(i, s) for i, s in found if i != -1]
            if found:
                i, s = min(found, key=lambda f: f[0])
                out = text[self.sent : i]
                self.sent = i
                self.stopped, self.hit, self.used = True, s, min(k + 1, len(tokens))
                return out, True
        hold = 0
        if not final:
            for s in self.stop:  # longest suffix of text that is a proper prefix of s
                for k in range(min(len(s) - 1, len(text) - self.sent), 0, -1):
                    if text.endswith(s[:k]):
                        hold = max(hold, k)
                        break
        end = len(text) - hold
        out = text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out, False

    def _find(self, text: str, s: str, start: int) -> int:
        """text.find(s, start), past matches that cut into a marker."""
        i = text.find(s, start)
        while i != -1 and any(
            a < i + len(s) and i < b and not (i <= a and b <= i + len(s)) for a, b in self.spans
        ):
            i = text.find(s, i + 1)
        return i


def _added_token_texts(tokenizer) -> dict[int, str]:
    """Added tokens of more than one character, by id (the HF tokenizer's table)."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    table = getattr(inner, "added_tokens_decoder", None) or {}
    texts = {int(i): getattr(t, "content", str(t)) for i, t in table.items()}
    return {i: t for i, t in texts.items() if len(t) > 1}


class EventText:
    """One generation's text, round event by round event: end-of-turn tokens hidden (and the
    `hidden` ids: the special tokens, for skip_special_tokens), stop strings cut (a chunk whose
    finish_reason is set is the generation's last)."""

    def __init__(
        self,
        pair,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        stop=(),
        hidden: frozenset[int] = frozenset(),
    ):
        self.stream = TextStream(pair.tokenizer, stop, context=prompt_ids)
        self.hidden = pair.with_defaults(params).stop_token_ids | hidden  # not text

    def chunk(self, ev: RoundEvent) -> TextChunk:
        shown = [i for i, t in enumerate(ev.tokens) if t not in self.hidden]
        visible = [ev.tokens[i] for i in shown]
        text, hit = self.stream.feed(visible, final=ev.finish_reason is not None)
        if hit:  # the round's tokens past the stop string's last are not the reply's
            ev = _cut(ev, shown[self.stream.used - 1] + 1)  # hidden ones before it kept
        return TextChunk(text, ev, "stop" if hit else ev.finish_reason, self.stream.hit)


def _cut(ev: RoundEvent, n: int) -> RoundEvent:
    """The event with only its first n tokens: what plain decoding would have generated
    before the stop string ended it (usage counts the same however rounds fell)."""
    if n >= len(ev.tokens):
        return ev
    accepted = min(ev.accepted, max(n - 1, 0))  # its last kept token counts as the bonus
    return replace(ev, tokens=ev.tokens[:n], accepted=accepted, logprobs=ev.logprobs[:n])


def stream_text(
    pair,
    prompt_ids: Sequence[int],
    params: GenerationParams,
    stop: Sequence[str] = (),
    session: Session | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Iterator[TextChunk]:
    """Generate and yield text per round; stops at EOS, a stop string or max_tokens.
    `cancel`: polled before the prefill, between its chunks and between rounds (True: the
    stream ends there, no further chunk). Bad arguments raise here, before anything runs."""
    if getattr(pair, "tokenizer", None) is None or getattr(pair, "decoder", None) is None:
        raise ParameterError(
            f"text needs a pair (load_pair: a tokenizer and a decoder), got {type(pair).__name__}"
        )
    ids = token_ids(prompt_ids, "the prompt", pair.vocab_size)  # read once
    texts = EventText(pair, ids, params, stop)
    return _text_chunks(texts, pair.stream(ids, params, session, cancel))


def _text_chunks(texts: EventText, events) -> Iterator[TextChunk]:
    try:
        for ev in events:
            chunk = texts.chunk(ev)
            yield chunk
            if chunk.finish_reason:
                return
    finally:
        events.close()


def generate_text(
    pair,
    prompt_ids: Sequence[int],
    params: GenerationParams,
    stop: Sequence[str] = (),
    session: Session | None = None,
) -> TextResult:
    parts: list[str] = []
    tokens: list[int] = []
    logprobs: list = []
    prompt_logprobs = None
    stats = GenerationStats()
    finish = "length"
    for chunk in stream_text(pair, prompt_ids, params, stop, session):
        parts.append(chunk.text)
        tokens.extend(chunk.event.tokens)
        logprobs.extend(chunk.event.logprobs)
        if chunk.event.prompt_logprobs is not None:
            prompt_logprobs = list(chunk.event.prompt_logprobs)
        stats.add(chunk.event)
        finish = chunk.finish_reason or finish
    return TextResult("".join(parts), tokens, finish, stats, logprobs, prompt_logprobs)
