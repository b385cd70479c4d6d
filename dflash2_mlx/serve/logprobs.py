"""A request's token log-probabilities in OpenAI's shape, gathered round by round.

The engine reads them off the verify rows (engine/logprobs.py); here each becomes a chat
entry (`token`, `logprob`, `bytes`, `top_logprobs`) or a completion's parallel lists
(`tokens`, `token_logprobs`, `top_logprobs`). The stop token that ends a reply is not text and
gets none, as in OpenAI's API. A stream sends each round's entries with the first chunk that
follows them (the last ones with the finish chunk).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.events import RoundEvent


@dataclass
class Logprobs:
    tokenizer: object
    kind: str  # "chat" | "completion"
    stop_ids: frozenset[int]
    pending: list = field(default_factory=list)  # TokenLogprobs not sent yet

    def add(self, event: RoundEvent) -> None:
        self.pending += [lp for lp in event.logprobs if lp.token not in self.stop_ids]

    def take(self) -> dict | None:
        """The pending entries as a choice's `logprobs` (None when there are none)."""
        if not self.pending:
            return None
        entries, self.pending = self.pending, []
        if self.kind == "chat":
            return {"content": [self._chat(lp) for lp in entries], "refusal": None}
        return {
            "tokens": [self._text(lp.token) for lp in entries],
            "token_logprobs": [lp.logprob for lp in entries],
            "top_logprobs": [{self._text(t): v for t, v in lp.top} for lp in entries],
            "text_offset": None,
        }

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _one(self, token: int, logprob: float) -> dict:
        text = self._text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _chat(self, lp) -> dict:
        return {**self._one(lp.token, lp.logprob), "top_logprobs": [self._one(*t) for t in lp.top]}
