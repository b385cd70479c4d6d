"""A conversation's state between generations: caches, committed tokens, and the context
features not yet given to the drafter.

Invariants between rounds: the target cache holds tokens[:-1] (the last committed token, the
anchor, is not yet fed); the drafter cache holds positions < drafter offset, and `pending`
holds the target features of the positions from there up to the anchor.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx

from .lookup import ContextLookup, PredictionLookup


@dataclass
class Session:
    """Conversation state reusable across generations with the same engine."""

    target_cache: list
    drafter_cache: list
    tokens: list[int] = field(default_factory=list)  # committed ids, prompt included
    pending: mx.array | None = None  # features for positions drafter_offset .. len(tokens)-2
    in_round: bool = False  # a round was interrupted midway: the caches are not consistent
    lookup: ContextLookup | None = None  # n-gram index of `tokens` (context lookup drafts)
    prediction: PredictionLookup | None = None  # the current generation's predicted answer
    owner: object = field(default=None, repr=False, compare=False)  # the decoder that made it
    # the generation using it (a weak reference: a dropped batch or stream frees it)
    holder: weakref.ref | None = field(default=None, repr=False, compare=False)
    # shown the session, consistent, when a prefill has fed all of its prompt but the last
    # token, and when it has fed `branch_points` tokens: a prompt cache keeps a recurrent
    # state there (one the same prompt, or another branching there, can resume)
    on_checkpoint: Callable[[Session], None] | None = field(default=None, repr=False, compare=False)
    branch_points: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def busy(self) -> bool:
        """A generation is using it: a second one would rewind its caches under the first."""
        return self.holder is not None and self.holder() is not None

    def hold(self, user: object) -> None:
        self.holder = weakref.ref(user)

    def release(self) -> None:
        self.holder = None

    def lend_target_cache(self) -> None:
        """Its target rows move into a batch cache (engine/batch.py): until they come back its
        own caches are not consistent (a batch dropped midway leaves it to clear on next use)."""
        self.target_cache, self.in_round = [], True

    def return_target_cache(self, target_cache: list) -> None:
        self.target_cache, self.in_round = target_cache, False

    @property
    def fed(self) -> int:
        """Tokens held by the target cache."""
        return max(len(self.tokens) - 1, 0)

    def reusable(self, prompt: list[int]) -> int:
        """Tokens of `prompt` a generation from it keeps from this session (the rest is
        prefilled; at least one token anew): their shared prefix, where the caches can be cut
        to it (0 after an interrupted round)."""
        if self.in_round:
            return 0
        fed, common = self.fed, 0
        limit = min(fed, len(prompt) - 1)
        while common < limit and self.tokens[common] == prompt[common]:
            common += 1
        if common < fed and not all(c.is_trimmable() for c in self.target_cache):
            return 0
        return common


def record(session: Session, commit: list[int], features: mx.array) -> None:
    """Append committed tokens to the session; queue their rows' features [1, n, F] (the
    anchor's and all but the last committed) for the drafter."""
    session.pending = (
        features if session.pending is None else mx.concatenate([session.pending, features], axis=1)
    )
    session.tokens.extend(commit)
    for index in (session.lookup, session.prediction):
        if index is not None:
            index.extend(commit)


def prediction_used(session: Session) -> int:
    """The prediction's tokens the answer followed since the last event (RoundEvent)."""
    return session.prediction.take_used() if session.prediction is not None else 0


def drafter_offset(session: Session) -> int:
    """Positions the session's drafter cache holds."""
    return session.drafter_cache[0].offset if session.drafter_cache else 0
