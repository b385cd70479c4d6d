"""A thinking budget: at most N tokens inside a thinking section, then its end marker.

A TokenConstraint (engine/constraint.py): while a section is open and has fewer than
`budget` tokens, every token is allowed; once it has `budget`, only the end marker's tokens
are, in order (they are also proposed as drafts). So the output is what plain decoding under
the same rule gives, and speculation still drafts and verifies it. `AllOf` applies several
constraints at once (a budget beside a response_format grammar).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..chat_template import thinking_left_open
from ..errors import ParameterError
from .constraint import ended


def think_markers(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(start, end) token ids of an mlx-lm tokenizer's thinking section (empty: none)."""
    start = tuple(getattr(tokenizer, "think_start_tokens", None) or ())
    end = tuple(getattr(tokenizer, "think_end_tokens", None) or ())
    return start, end


def can_budget(tokenizer) -> bool:
    """The model has both thinking markers: a thinking budget can hold it."""
    return all(think_markers(tokenizer))


@dataclass
class _State:
    inside: bool
    count: int = 0  # tokens in the open section
    forcing: int = -1  # end-marker tokens written since the budget ran out (-1: not yet)
    tail: tuple[int, ...] = ()  # the last tokens (markers span several)
    spent: bool = False  # the reply's one section is over, or the reply began without one


@dataclass
class ThinkingBudget:
    """Budgets the thinking section a reply opens with (the prompt opened it, or the reply's
    first tokens are its start marker); a marker anywhere later (quoted in an answer, say) is
    text, as it is to a response_format grammar."""

    start: tuple[int, ...]  # the marker that opens a section (token ids)
    end: tuple[int, ...]  # the marker that closes it
    budget: int
    vocab: int
    state: _State = field(default_factory=lambda: _State(False))

    @classmethod
    def factory(cls, start, end, budget: int, vocab: int, opened: bool):
        """GenerationParams.constraint: a fresh budget per generation (`opened`: the prompt
        left a section open)."""
        forcing = 0 if opened and budget <= 0 else -1
        return lambda: cls(tuple(start), tuple(end), budget, vocab, _State(opened, 0, forcing))

    @classmethod
    def for_prompt(cls, tokenizer, prompt_ids, budget: int, vocab: int):
        """The factory for a reply to `prompt_ids` with an mlx-lm tokenizer's think markers;
        a ParameterError when the model has none."""
        start, end = think_markers(tokenizer)
        if not start or not end:
            raise ParameterError("this model has no thinking section to budget")
        opened = thinking_left_open(tokenizer, list(prompt_ids))
        return cls.factory(start, end, budget, vocab, opened)

    def _next(self, s: _State, token: int) -> _State:
        keep = max(len(self.start), len(self.end))
        tail = (s.tail + (token,))[-keep:]
        if s.spent:
            return s
        if s.forcing >= 0:
            done = s.forcing + 1 >= len(self.end)
            return _State(not done, s.count, -1 if done else s.forcing + 1, tail, done)
        if s.inside:
            if tail[-len(self.end) :] == self.end:
                return _State(False, 0, -1, tail, spent=True)
            count = s.count + 1
            return _State(True, count, self._started(tail) if count >= self.budget else -1, tail)
        if tail != self.start[: len(tail)]:  # the reply does not open with a section
            return _State(False, tail=tail, spent=True)
        opened = len(tail) == len(self.start)
        return _State(opened, 0, 0 if opened and self.budget <= 0 else -1, tail)

    def _started(self, tail: tuple[int, ...]) -> int:
        """End-marker tokens the section's last tokens already spell (a marker of several
        tokens may have begun): forcing goes on from there."""
        for k in range(min(len(self.end) - 1, len(tail)), 0, -1):
            if tail[-k:] == self.end[:k]:
                return k
        return 0

    def _row(self, s: _State) -> np.ndarray:
        if s.forcing < 0:
            return np.ones(self.vocab, bool)
        row = np.zeros(self.vocab, bool)
        row[self.end[s.forcing]] = True
        return row

    def allowed(self, drafts: Sequence[int]) -> np.ndarray:
        s, rows = self.state, []
        for t in [None, *drafts]:
            if t is not None:
                s = self._next(s, int(t))
            rows.append(self._row(s))
        return np.stack(rows)

    def commit(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.state = self._next(self.state, int(t))

    def forced(self) -> list[int]:
        s = self.state
        return list(self.end[s.forcing :]) if s.forcing >= 0 else []


class AllOf:
    """Several constraints at once: a token must be allowed by each; the first that forces
    text proposes it."""

    def __init__(self, *constraints):
        self.constraints = constraints

    def allowed(self, drafts: Sequence[int]) -> np.ndarray:
        rows = [c.allowed(drafts) for c in self.constraints]
        width = max(r.shape[-1] for r in rows)
        padded = [np.pad(r, [(0, 0), (0, width - r.shape[-1])]) for r in rows]
        return np.logical_and.reduce(padded)

    def commit(self, tokens: Sequence[int]) -> None:
        for c in self.constraints:
            c.commit(tokens)

    def on_stop(self) -> None:
        for c in self.constraints:
            ended(c)

    def forced(self) -> list[int]:
        return next((f for c in self.constraints if (f := c.forced())), [])


@dataclass(frozen=True)
class BothFactories:
    """GenerationParams.constraint for two factories at once (the first's stop_ids kept)."""

    first: object
    second: object

    @property
    def stop_ids(self):
        return getattr(self.first, "stop_ids", frozenset())

    def __call__(self):
        return AllOf(self.first(), self.second())
