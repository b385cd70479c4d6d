"""DFlash2 candidate path selector.

Per drafted row t: top-K candidates C_t of the unary logits U_t, a projected hidden
h_t = W_H n_t (rank r), and pair scores S_t[a, b] = U_t[C_t[b]] + sum_j A[a, j] h_t[j] B[C_t[b], j]
for each predecessor a (the anchor for t = 1, else the K candidates of row t-1). The whole
[γ, K, K] lattice is computed in one vectorised pass; only the walk is sequential and it stays
on device (no host sync). A sampled walk picks each step by Gumbel-max over uniforms drawn
from the key, so the Metal walk (which takes the uniforms) makes the very same draws. The
lattice and walk ops are `kernels.pair_scores` / `kernels.walk` (Metal kernels, or the
references in kernels/_references.py).

Greedy drafting (temperature 0) does not walk step by step by default:
`kernels.expected_walk_choices` picks the path with the most accepted drafts expected under
the lattice's own conditionals, a backward pass over the [K, K] tiles (a Metal kernel, or its reference in kernels/_references.py;
`walk_calibration` None: the official stepwise walk). Any path keeps the output exact (the
verify decides); this one is accepted further.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .. import kernels

# Temperature of the conditionals softmax(scores / T) the expected walk trusts: 1, the model's
# own. Teacher-forced with the shipped SmolLM2 drafter (stage 24), τ of the stepwise walk -> the
# expected walk at T 1.0 / 1.5 / 2.0 (docs/results/smollm2-expected-walk.json): 61 held-out
# continuations, 7 drafts 2.027 -> 2.047 / 2.054 / 2.053, 3 drafts 1.923 -> 1.934 / 1.937 /
# 1.937; 300 unseen chat continuations, 7 drafts 3.147 -> 3.173 / 3.160 / 3.155, 3 drafts
# 2.460 -> 2.461 / 2.459 / 2.456. 1.5 would suit the held-out set; 1.0 holds up on both.
EXPECTED_WALK_CALIBRATION = 1.0


@dataclass
class SelectorOutput:
    tokens: mx.array  # [..., γ] chosen ids
    candidates: mx.array  # [..., γ, K] candidate ids
    q: mx.array | None  # [..., γ, K] walk probabilities (sampling), None when greedy


class CandidateSelector(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        # greedy drafts: the expected walk at this calibration, or None: the stepwise walk
        self.walk_calibration: float | None = EXPECTED_WALK_CALIBRATION
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        # Raw tensors, as in the official checkpoints (no ".weight" suffix).
        self.predecessor_codebook = mx.random.normal((vocab_size, rank)) * 0.02
        self.successor_codebook = mx.zeros((vocab_size, rank))

    def candidates(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        """Top-K ids (ascending: argpartition's order moves with float noise far from the
        top, and a sampled walk's draws follow the candidates' order) and their unary scores."""
        k = min(self.top_k, logits.shape[-1])
        ids = mx.stop_gradient(mx.sort(mx.argpartition(logits, -k, axis=-1)[..., -k:], axis=-1))
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
        if temperature <= 0 and self.walk_calibration is not None:
            idx, q = kernels.expected_walk_choices(scores, float(self.walk_calibration)), None
        else:
            idx, q = kernels.walk(scores, temperature, key)
        tokens = mx.take_along_axis(cand, idx[..., None], axis=-1)[..., 0]
        return SelectorOutput(tokens, cand, q)
