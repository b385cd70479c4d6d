"""A request's token log-probabilities in OpenAI's shape, gathered round by round.

The engine reads them off the verify rows (engine/logprobs.py); here each becomes a chat
entry (`token`, `logprob`, `bytes`, `top_logprobs`) or a completion's parallel lists
(`tokens`, `token_logprobs`, `top_logprobs`). A token goes out once the text it starts in has
gone out, so a stream sends each entry with the chunk of its text (or a later one) and the
tokens past a stop string, whose text is never sent, get none; nor does the stop token that
ends a reply, as in OpenAI's API. `bytes` are the token's own bytes (half of a character for
a byte-level token that splits one), `token` their text.

A completion's `echo` puts the prompt's tokens first (`echo_prompt`: the first with no
log-probability, as OpenAI's) and counts the reply's offsets after the prompt's text; the
token that ends the reply (a stop token, or one that completes a stop string) keeps its entry
there, so a scorer that drops the last entry (the generated one) never drops a prompt token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..engine.events import RoundEvent
from ..engine.logprobs import TokenLogprob
from ..text import IncrementalDecoder
from ..token_bytes import token_bytes


@dataclass
class Logprobs:
    tokenizer: object
    kind: str  # "chat" | "completion"
    stop_ids: frozenset[int]  # the stop tokens (not text: no entry)
    prompt: Sequence[int] = ()  # the text continues these ids
    entries: list = field(default_factory=list)  # (start in the text, TokenLogprob), unsent
    decoder: IncrementalDecoder | None = None
    hidden: frozenset[int] = frozenset()  # other ids that are not text (skip_special_tokens)
    base: int = 0  # characters before the reply's text (an echoed prompt's)
    keep_stop: bool = False  # the stop token that ends the reply has an entry (echo)

    def __post_init__(self):
        self.decoder = IncrementalDecoder(self.tokenizer, self.prompt)

    def echo_prompt(self, prompt: EchoedPrompt, scores: Sequence[TokenLogprob]) -> None:
        """The prompt's tokens first: the first unscored, then `scores` (one a token after)."""
        first = TokenLogprob(self.prompt[0], None)
        self.entries += list(zip(prompt.starts, [first, *scores]))
        self.base, self.keep_stop = len(prompt.text), True

    def add(self, event: RoundEvent) -> None:
        for lp in event.logprobs:
            hidden = lp.token in self.hidden and lp.token not in self.stop_ids
            if self.keep_stop or not (hidden or lp.token in self.stop_ids):
                if hidden:  # not text: the next token's starts where it would have
                    start = len(self.decoder.text)
                else:
                    start = self.decoder.start_of(lp.token)
                    self.decoder.add([lp.token])
                self.entries.append((self.base + start, lp))

    def take(self, sent: int, whole: bool = False, end: bool = False) -> dict | None:
        """The entries of the tokens starting in the first `sent` characters of the text as a
        choice's `logprobs`; they are not sent again. None when there are none, but for a
        `whole` reply (an empty one asked for logprobs: empty lists, which clients index).
        At the `end` (a whole reply's too) with `keep_stop` (echo) every entry left goes:
        the token that ended the reply, a stop token or one completing a stop string."""
        if (end or whole) and self.keep_stop:  # echo: every generated token keeps its entry
            starts = [start for start, _ in self.entries]
        else:
            starts = [start for start, _ in self.entries if start < sent]
        ready = [lp for _, lp in self.entries[: len(starts)]]
        self.entries = self.entries[len(ready) :]
        if not ready and not whole:
            return None
        if self.kind == "chat":
            return {"content": [self._chat(lp) for lp in ready], "refusal": None}
        return {
            "tokens": [self._key(lp.token) for lp in ready],
            "token_logprobs": [lp.logprob for lp in ready],
            "top_logprobs": [None if lp.logprob is None else self._top(lp) for lp in ready],
            "text_offset": starts,  # where each token's text starts in the completion's
        }

    def _key(self, token: int) -> str:
        """A completion token's text, or for one that is part of a character its bytes as
        OpenAI writes them ("bytes:\\xe3\\x81"): distinct tokens stay distinct keys."""
        raw = token_bytes(self.tokenizer, token)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def _top(self, lp) -> dict:
        """The alternatives by key, most likely first, and the chosen token (OpenAI: "up to
        logprobs+1 elements"; logprobs=0 gives it alone); two tokens with one text (rare: a
        vocabulary's duplicates) keep the likelier one's value."""
        out: dict[str, float] = {}
        for t, v in lp.top:
            out.setdefault(self._key(t), v)
        out.setdefault(self._key(lp.token), lp.logprob)
        return out

    def _one(self, token: int, logprob: float) -> dict:
        raw = token_bytes(self.tokenizer, token)
        return {"token": self._key(token), "logprob": logprob, "bytes": list(raw)}

    def _chat(self, lp) -> dict:
        return {**self._one(lp.token, lp.logprob), "top_logprobs": [self._one(*t) for t in lp.top]}


class LogprobChunks:
    """Puts the log-probabilities gathered so far on the next chunk sent (none: as it is)."""

    def __init__(self, lp: Logprobs | None):
        self.lp, self.sent = lp, 0  # characters of text the stream has been given

    def add(self, item) -> None:
        """A queue item (its event and text) of the stream."""
        if self.lp is not None:
            self.lp.add(item.event)
            self.sent += len(item.text)

    def __call__(self, chunk: dict) -> dict:
        if self.lp is not None and chunk["choices"]:
            end = chunk["choices"][0]["finish_reason"] is not None
            chunk["choices"][0]["logprobs"] = self.lp.take(self.sent, end=end)
        return chunk


@dataclass(frozen=True)
class EchoedPrompt:
    """A completion's prompt as `echo` returns it: its tokens' text, and where each starts."""

    text: str
    starts: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer, ids: Sequence[int]) -> EchoedPrompt:
        decoder, starts = IncrementalDecoder(tokenizer), []
        for i, t in enumerate(ids):
            starts.append(len(decoder.text))
            decoder.add([t], final=i == len(ids) - 1)
        return cls(decoder.text, tuple(starts))
