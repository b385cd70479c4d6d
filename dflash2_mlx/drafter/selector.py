"""DFlash2 candidate path selector (pure-MLX reference).

Per drafted row t: top-K candidates C_t of the unary logits U_t, a projected hidden
h_t = W_H n_t (rank r), and pair scores S_t[a, b] = U_t[C_t[b]] + sum_j A[a, j] h_t[j] B[C_t[b], j]
for each predecessor a (the anchor for t = 1, else the K candidates of row t-1). The whole
[γ, K, K] lattice is computed in one vectorised pass; only the walk is sequential and it stays
on device (no host sync). A sampled walk picks each step by Gumbel-max over uniforms drawn
from the key, so the Metal walk (which takes the uniforms) makes the very same draws.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .. import kernels

# mx.random.gumbel draws uniform(nextafter(0, 1), 1): the smallest positive float32.
_TINY = struct.unpack("<f", struct.pack("<I", 1))[0]


@dataclass
class SelectorOutput:
    tokens: mx.array  # [..., γ] chosen ids
    candidates: mx.array  # [..., γ, K] candidate ids
    q: mx.array | None  # [..., γ, K] walk probabilities (sampling), None when greedy


def pair_scores(
    unary: mx.array, hidden: mx.array, pred_rows: mx.array, succ_rows: mx.array
) -> mx.array:
    """unary [..., γ, K]; hidden [..., γ, r]; pred_rows [..., γ, P, r]; succ_rows [..., γ, K, r]
    -> [..., γ, P, K] fp32. Reference op; metal/pair_scores.metal has this signature
    (`kernels.pair_scores` dispatches between the two)."""
    weighted = pred_rows.astype(mx.float32) * hidden.astype(mx.float32)[..., None, :]
    edges = weighted @ succ_rows.astype(mx.float32).swapaxes(-1, -2)
    return unary.astype(mx.float32)[..., None, :] + edges


def walk(lattice: mx.array, temperature: float, key: mx.array | None = None):
    """Walk lattices [..., γ, P, K]: row 0 has one predecessor (the anchor), row t>0 is
    indexed by the previous choice. Returns (choices [..., γ], q [..., γ, K] or None).
    Sampling draws its noise from `key` (global PRNG when None), then walks it."""
    *lead, gamma, _, k = lattice.shape
    uniforms = None if temperature <= 0 else draw_walk_uniforms(tuple(lead), gamma, k, key)
    return walk_with_uniforms(lattice, temperature, uniforms)


def draw_walk_uniforms(
    lead: tuple[int, ...], gamma: int, k: int, key: mx.array | None
) -> mx.array:
    """The uniforms [*lead, gamma, k] that `selector.walk(..., key)` consumes (key None: the
    global PRNG, advanced exactly as the reference walk advances it)."""
    n = math.prod(lead)
    keys = mx.random.split(key, gamma) if key is not None else None
    steps = [
        mx.random.uniform(_TINY, 1.0, (n, k), mx.float32, key=None if keys is None else keys[t])
        for t in range(gamma)
    ]
    return mx.stack(steps, axis=1).reshape(*lead, gamma, k)


def argmax_skipping_nan(x: mx.array) -> mx.array:
    """argmax over the last axis where NaN never wins (lowest index on ties; a row of only NaN
    or -inf gives 0): what Metal's mx.argmax does and the walk kernels do. CPU's mx.argmax
    picks the first NaN instead, so the NaN are masked to keep one rule on every device."""
    return mx.argmax(mx.where(mx.isnan(x), -mx.inf, x), axis=-1)


def walk_with_uniforms(lattice: mx.array, temperature: float, uniforms: mx.array | None):
    """Reference walk over lattices [..., g, P, K] with the sampling noise given as uniforms
    [..., g, K] (ignored when greedy). Returns (choices [..., g] int32, q [..., g, K] or None)."""
    *lead, gamma, preds, k = lattice.shape
    flat = lattice.reshape(-1, gamma, preds, k)
    n = flat.shape[0]
    rows = mx.arange(n)
    u = None if temperature <= 0 else uniforms.reshape(n, gamma, k)
    prev = mx.zeros((n,), dtype=mx.int32)
    picks, qs = [], []
    for t in range(gamma):
        scores = flat[:, t, 0] if t == 0 else flat[rows, t, prev]
        if temperature > 0:
            logits = scores / temperature
            qs.append(mx.softmax(logits, axis=-1))
            gumbel = -mx.log(-mx.log(u[:, t]))
            choice = argmax_skipping_nan(logits + gumbel)
        else:
            choice = argmax_skipping_nan(scores)
        prev = choice.astype(mx.int32)
        picks.append(prev)
    picks = mx.stack(picks, axis=-1).reshape(*lead, gamma)
    q = mx.stack(qs, axis=1).reshape(*lead, gamma, k) if qs else None
    return picks, q


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

    def lattice(self, hidden: mx.array, logits: mx.array, anchor: mx.array,
                vocab: mx.array | None = None):
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
        self, hidden: mx.array, logits: mx.array, anchor: mx.array,
        temperature: float = 0.0, key: mx.array | None = None, vocab: mx.array | None = None,
    ) -> SelectorOutput:
        cand, scores = self.lattice(hidden, logits, anchor, vocab)
        idx, q = kernels.walk(scores, temperature, key)
        tokens = mx.take_along_axis(cand, idx[..., None], axis=-1)[..., 0]
        return SelectorOutput(tokens, cand, q)
