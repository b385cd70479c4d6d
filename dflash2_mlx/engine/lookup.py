"""Context lookup: a second, model-free source of drafts (prompt-lookup decoding).

When the last `min_match` committed tokens occurred earlier in the context (prompt or answer),
the tokens that followed them then are proposed as this round's drafts. Small targets repeat
themselves and answers quote their prompts (summaries, multi-turn, code edits), so these
proposals are often long and right; the verify is unchanged, so greedy output is still exactly
the target's, and sampling stays exact (the proposal is a point mass: accepted with
probability p(x)). Rounds where it fires skip the drafter's pass.
"""

from __future__ import annotations

from typing import Sequence
from ..values import is_int

# The high-level API's and the CLI's default min_match, and how far a repeat is trusted: a
# match whose context agrees on fewer than SURE_AGREEMENT tokens (the key's included; only with
# min_match < 3) proposes at most SHORT_DRAFTS, so that less sure repeats do not each pay a
# wide verify. Replayed on the 61 held-out continuations with stage 23 (block 8, a verify of w
# tokens costing 1 + (w - 1)/20 or /12 one-token verifies; docs/results/smollm2-lookup-cap.json):
# keys of 3, τ 2.618; keys of 2 uncapped, 2.642 but 0.5-1.4 % slower; capped, 2.619 and 1.7-2.8 %
# faster. On the 7-prompt bench (block 4) keys of 2, capped, still lost 2 % in total (τ 3.23 vs
# 3.27, ABAB), so 3.
DEFAULT_LOOKUP = 3
SURE_AGREEMENT = 3
SHORT_DRAFTS = 5
# Choosing among a repeat's earlier occurrences: the one whose preceding tokens agree with the
# context's furthest, comparing up to LOOK_BACK tokens before the key, among its RECENT latest
# occurrences (a frequent n-gram in a long context stays cheap). Ties: the latest.
LOOK_BACK = 16
RECENT = 64
# Tokens verified in a round drafted by lookup or a prediction when no profile says otherwise
# (GenerationParams.lookup_block): such rounds run no draft pass, so a long repeat is worth a
# wider verify than the drafter's block (`dflash2 bench --autotune` measures the best width).
DEFAULT_LOOKUP_BLOCK = 16


def _checked(min_match: int) -> int:
    if not is_int(min_match, 1):
        raise ValueError(f"min_match must be an int >= 1, got {min_match!r}")
    return min_match


class ContextLookup:
    """Index of the committed tokens' n-grams (n = `min_match`) -> their starts that have at
    least one token after them. Extended as tokens are committed; rebuilt by `reset`.
    `propose` follows the occurrence whose preceding tokens agree with the context's furthest
    (up to LOOK_BACK more tokens compared, among the RECENT latest; ties: the latest), for up
    to `short` tokens when fewer than `sure` agree."""

    def __init__(self, min_match: int, sure: int = SURE_AGREEMENT, short: int = SHORT_DRAFTS):
        self.n = _checked(min_match)
        self.sure, self.short = sure, short
        self.tokens: list[int] = []
        self._starts: dict[tuple[int, ...], list[int]] = {}

    def reset(self, tokens: Sequence[int]) -> None:
        self.tokens, self._starts = [], {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        start = max(len(self.tokens) - self.n, 0)  # n-grams that now gain a successor
        self.tokens.extend(int(t) for t in tokens)
        t, n = self.tokens, self.n
        for i in range(start, len(t) - n):
            self._starts.setdefault(tuple(t[i : i + n]), []).append(i)

    def propose(self, length: int) -> list[int]:
        """Up to `length` tokens that followed the earlier occurrence of the last n committed
        tokens with the longest agreeing context (none when they never occurred before)."""
        return self.find(length)[0]

    def find(self, length: int) -> tuple[list[int], int]:
        """propose's tokens and how many context tokens agree with that occurrence's (the key's
        n, plus up to LOOK_BACK before it; 0 with no proposal)."""
        t, n = self.tokens, self.n
        if length < 1 or len(t) <= n:
            return [], 0
        starts = self._starts.get(tuple(t[-n:]))
        if not starts:
            return [], 0
        key = len(t) - n  # where the last n tokens start
        best, agreed = starts[-1], -1
        for i in reversed(starts[-RECENT:]):
            k = 0
            while k < LOOK_BACK and k < i and t[i - 1 - k] == t[key - 1 - k]:
                k += 1
            if k > agreed:
                best, agreed = i, k
        agreed += n
        if agreed < self.sure:
            length = min(length, self.short)
        return t[best + n : best + n + length], agreed


class PredictionLookup:
    """Drafts from a caller's guess of the answer (OpenAI's Predicted Outputs: an editor sends
    the file it expects back, nearly unchanged). While the answer has followed the prediction,
    its next tokens are proposed; after a divergence, the continuation of the first occurrence
    of the answer's last `min_match` tokens at or after the last aligned point (else anywhere)
    is, so an edit costs a round or two and the rest is drafted again. A hint only: the verify
    decides every token."""

    def __init__(self, predicted: Sequence[int], min_match: int = DEFAULT_LOOKUP):
        self.n = n = _checked(min_match)
        self.predicted = [int(t) for t in predicted]
        self._starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> where what follows starts
        for i in range(len(self.predicted) - n):
            self._starts.setdefault(tuple(self.predicted[i : i + n]), []).append(i + n)
        self.cursor: int | None = 0  # where the answer is aligned with the prediction
        self._last = 0  # the latest aligned point (where a re-sync is looked for first)
        self.answer: list[int] = []
        # the prediction's tokens the answer has followed (OpenAI's accepted_prediction_tokens:
        # "in the prediction that appeared in the completion"), each counted once, whoever
        # drafted them: a cursor of its own, re-synced on every `min_match` tokens
        self._used = bytearray(len(self.predicted))
        self._fresh = 0  # of those, marked since take_used()
        self._follows: int | None = 0  # where the answer follows the prediction (counting)

    def extend(self, tokens: Sequence[int]) -> None:
        """The answer's newly committed tokens."""
        tokens = [int(t) for t in tokens]
        self.answer.extend(tokens)
        self._count(len(self.answer) - len(tokens))
        c = self.cursor
        if c is not None and self.predicted[c : c + len(tokens)] == tokens:
            self.cursor = self._last = c + len(tokens)
        else:
            self.cursor = None

    def take_used(self) -> int:
        """Prediction tokens the answer followed since the last call."""
        fresh, self._fresh = self._fresh, 0
        return fresh

    def _count(self, first: int) -> None:
        """Marks the prediction's tokens that the answer's tokens from `first` on follow."""
        pred, answer, n, c = self.predicted, self.answer, self.n, self._follows
        for pos in range(first, len(answer)):
            if c is not None and c < len(pred) and pred[c] == answer[pos]:
                self._mark(c)
                c += 1
                continue
            c = None
            starts = (
                self._starts.get(tuple(answer[pos - n + 1 : pos + 1])) if pos + 1 >= n else None
            )
            if starts:  # back in step: the key and the run before it that matches too
                c = next((s for s in starts if not self._used[s - 1]), starts[0])
                k = 1
                while c - k >= 0 and pos - k + 1 >= 0 and pred[c - k] == answer[pos - k + 1]:
                    self._mark(c - k)
                    k += 1
        self._follows = c

    def _mark(self, i: int) -> None:
        self._fresh += not self._used[i]
        self._used[i] = 1

    def propose(self, length: int, resync: bool = True) -> list[int]:
        """The next `length` predicted tokens while aligned; else, with `resync`, those after
        a re-sync on the answer's last `min_match` tokens (the engine asks context lookup
        first: the prompt usually quotes what is predicted, and it knows the answer's own
        repeats)."""
        if length < 1:
            return []
        if self.cursor is None:
            n = self.n
            starts = self._starts.get(tuple(self.answer[-n:])) if len(self.answer) >= n else None
            if not resync or not starts:
                return []
            after = [s for s in starts if s >= self._last]
            self.cursor = after[0] if after else starts[-1]
        return self.predicted[self.cursor : self.cursor + length]
