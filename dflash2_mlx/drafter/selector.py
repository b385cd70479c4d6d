"""DFlash2 candidate path selector.

Per drafted row t: top-K candidates C_t of the unary logits U_t, a projected hidden
h_t = W_H n_t (rank r), and pair scores S_t[a, b] = U_t[C_t[b]] + sum_j A[a, j] h_t[j] B[C_t[b], j]
for each predecessor a (the anchor for t = 1, else the K candidates of row t-1). The whole
[γ, K, K] lattice is computed in one vectorised pass; only the walk is sequential and it stays
on device (no host sync). A sampled walk picks each step by Gumbel-max over uniforms drawn
from the key, so the Metal walk (which takes the uniforms) makes the very same draws. The
lattice and walk ops are `kernels.pair_scores` / `kernels.walk` (Metal kernels, or the
references in kernels/_references.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .. import kernels


@dataclass
class SelectorOutput:
    tokens: mx.array  # [..., γ] chosen ids
    candidates: mx.array  # [..., γ, K] candidate ids
    q: mx.array | None  # [..., γ, K] walk probabilities (sampling), None when greedy


class CandidateSelector(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        # Raw tensors, as in the official checkpoints (no ".weight" suffix).
        self.predecessor_codebook = mx.random.normal((vocab_size, rank)) * 0.02
        self.successor_codebook = mx.zeros((vocab_size, rank))

    def candidates(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        """Top-K ids (unsorted, argpartition order) and their unary scores."""
        k = min(self.top_k, logits.shape[-1])
        ids = mx.argpartition(logits, -k, axis=-1)[..., -k:]
        return ids, mx.take_along_axis(logits, ids, axis=-1)

    def lattice(
        self, hidden: mx.array, logits: mx.array, anchor: mx.array, vocab: mx.array | None = None
    ):
        """hidden [..., γ, H]; logits [..., γ, V] (or [..., γ, N] over the ids `vocab`); anchor
        ids [...] -> (candidate ids [..., γ, K], lattice [..., γ, K, K]); row 0's predecessors
        are all the anchor."""
        cand, unary = self.candidates(logits)
        if vocab is not None:
            cand = vocab[cand]
        proj = self.hidden_projection(hidden)
        first = mx.broadcast_to(anchor[..., None, None], (*cand.shape[:-2], 1, cand.shape[-1]))
        preds = mx.concatenate([first.astype(cand.dtype), cand[..., :-1, :]], axis=-2)
        scores = kernels.pair_scores(
            unary, proj, self.predecessor_codebook[preds], self.successor_codebook[cand]
        )
        return cand, scores

    def select(
        self,
        hidden: mx.array,
        logits: mx.array,
        anchor: mx.array,
        temperature: float = 0.0,
        key: mx.array | None = None,
        vocab: mx.array | None = None,
    ) -> SelectorOutput:
        cand, scores = self.lattice(hidden, logits, anchor, vocab)
        idx, q = kernels.walk(scores, temperature, key)
        tokens = mx.take_along_axis(cand, idx[..., None], axis=-1)[..., 0]
        return SelectorOutput(tokens, cand, q)
