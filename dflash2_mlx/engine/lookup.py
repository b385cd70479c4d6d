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

# The high-level API's and the CLI's default min_match: on the held-out prompts (README,
# "Context lookup") 2 and 3 did alike, 3 fires on fewer, surer repeats.
DEFAULT_LOOKUP = 3


class ContextLookup:
    """Index of the committed tokens' n-grams (n = `min_match`) -> their latest start that has
    at least one token after it. Extended as tokens are committed; rebuilt by `reset`."""

    def __init__(self, min_match: int):
        if not isinstance(min_match, int) or isinstance(min_match, bool) or min_match < 1:
            raise ValueError(f"min_match must be an int >= 1, got {min_match!r}")
        self.n = min_match
        self.tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}

    def reset(self, tokens: Sequence[int]) -> None:
        self.tokens, self._latest = [], {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        start = max(len(self.tokens) - self.n, 0)  # n-grams that now gain a successor
        self.tokens.extend(int(t) for t in tokens)
        t, n = self.tokens, self.n
        for i in range(start, len(t) - n):
            self._latest[tuple(t[i:i + n])] = i

    def propose(self, length: int) -> list[int]:
        """Up to `length` tokens that followed the latest earlier occurrence of the last n
        committed tokens (none when they never occurred before)."""
        t, n = self.tokens, self.n
        if length < 1 or len(t) <= n:
            return []
        i = self._latest.get(tuple(t[-n:]))
        if i is None:
            return []
        return t[i + n:i + n + length]
