"""What a round verifies: the drafts, the distribution they were drawn from, and their source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx

from ..drafter.model import DraftBlock
from .events import DraftSource


@dataclass(frozen=True)
class Proposal:
    """`drafts` [γ] ids to verify after the anchor; `q` the distribution each was drawn from
    (None when greedy): [γ, V] over the vocabulary, or [γ, K] over `candidates` [γ, K] ids."""

    drafts: list[int]
    q: mx.array | None
    candidates: mx.array | None
    source: DraftSource

    @classmethod
    def point_mass(cls, found: Sequence[int], source: DraftSource) -> "Proposal":
        """Model-free drafts (lookup, prediction): q = 1 on the one candidate of each row,
        so the rejection sampler accepts each with probability p(x)."""
        ids = mx.array(list(found))
        return cls(list(found), mx.ones((len(found), 1)), ids[:, None], source)

    @classmethod
    def from_drafter(cls, block: DraftBlock) -> "Proposal":
        return cls(block.tokens.tolist(), block.q, block.candidates, "drafter")


NOTHING = Proposal([], None, None, "drafter")  # a round that verifies only the anchor
