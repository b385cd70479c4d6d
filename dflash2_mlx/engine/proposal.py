"""What a round verifies: the drafts, the distribution they were drawn from, and their source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx

from ..drafter.model import DraftBlock
from .events import DraftSource


@dataclass(frozen=True, eq=False)
class Proposal:
    """`drafts` [γ] ids to verify after the anchor; `q` the distribution each was drawn from
    (None when greedy): [γ, V] over the vocabulary, or [γ, K] over `candidates` [γ, K] ids.
    A drafter's ids stay an array until `drafts` is first read, so the target's verify graph
    can be built (`verify_ids`) while the drafter's pass still runs — as far as MLX lets a
    pass run ahead of the caller (on the CPU ~100 ops, so there most of it has run by then)."""

    ids: list[int] | mx.array
    q: mx.array | None
    candidates: mx.array | None
    source: DraftSource

    @property
    def drafts(self) -> list[int]:
        if not isinstance(self.ids, list):  # waits for the drafter's pass, once
            object.__setattr__(self, "ids", self.ids.tolist())
        return self.ids

    def verify_ids(self, anchor: int) -> mx.array:
        """[1, 1 + γ]: the anchor then the drafts, without waiting for a drafter's pass."""
        if isinstance(self.ids, list):
            return mx.array([[anchor] + self.ids])
        return mx.concatenate([mx.array([anchor], dtype=self.ids.dtype), self.ids])[None]

    @classmethod
    def point_mass(cls, found: Sequence[int], source: DraftSource) -> "Proposal":
        """Model-free drafts (lookup, prediction): q = 1 on the one candidate of each row,
        so the rejection sampler accepts each with probability p(x)."""
        ids = mx.array(list(found))
        return cls(list(found), mx.ones((len(found), 1)), ids[:, None], source)

    @classmethod
    def from_drafter(cls, block: DraftBlock) -> "Proposal":
        """The block's drafts, its pass started (mx.async_eval) but not waited for."""
        mx.async_eval(block.tokens)
        return cls(block.tokens, block.q, block.candidates, "drafter")


NOTHING = Proposal([], None, None, "drafter")  # a round that verifies only the anchor
