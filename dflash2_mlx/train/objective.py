"""Batched training forward of a drafter and the DFlash / DFlash2 objective.

A batch of sequences at once (features right-padded): each sequence's target features give its
context rows (projected once per layer), and n anchors per sequence give n blocks
[x_a, MASK, ...] drafted in parallel. Block j's queries see
context keys strictly before its anchor (within the window for sliding layers) and their own
block (bidirectionally, or causally for causal layers) — the same visibility as inference.

Loss = decay-weighted block cross-entropy (w_k = exp(-(k-1)/γ)) + λ · selector cross-entropy
over the top-K candidates scored with the gold predecessor (DFlash2) + μ · decay-weighted
KL(target ‖ drafter) at every supervised block position (distillation: the target's whole
next-token distribution, read off its last layer's cached output, carries far more per position
than the one gold token — the lever when training data is scarce). Fixed text (fixed_text.py)
carries a mask: only its exactly-labelled positions count, in every term. The softmax may run
over a vocabulary subset (the tokens seen in training plus sampled negatives) to save compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from ..drafter.model import Drafter


@dataclass
class Blocks:
    """Training blocks of a batch of sequences (features right-padded to a common length S;
    padding is never visible because every anchor is at most the real length - B)."""

    features: mx.array  # [b, S, N_f*H] (already scaled)
    anchors: mx.array  # [b, n] int32 anchor positions
    block_ids: mx.array  # [b, n, B] = [x_a, MASK, ...]
    labels: mx.array  # [b, n, B-1] = x_{a+1} .. x_{a+B-1} (fixed text: the target's argmax)
    mask: mx.array | None = None  # [b, n, B-1] 1 where the label is exact (fixed text)
    fixed: bool = False  # fixed text labelled by the target (its own distillation weight)

    def flat(self) -> tuple[mx.array, mx.array, mx.array]:
        """(anchors [b*n], block ids [b*n, B], labels [b*n, B-1])."""
        return (
            self.anchors.reshape(-1),
            self.block_ids.reshape(-1, self.block_ids.shape[-1]),
            self.labels.reshape(-1, self.labels.shape[-1]),
        )


def decay_weights(block_size: int, gamma: float | None = None) -> mx.array:
    """w_k = exp(-(k-1)/γ) for k = 1..B-1; γ = 7 (B=16), 5 (B=10), 4 (B=8) as published."""
    if gamma is None:
        gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, (block_size - 1) / 2))
    return mx.exp(-mx.arange(block_size - 1, dtype=mx.float32) / gamma)


def _visibility(attn, anchors: mx.array, ctx_len: int, block: int) -> mx.array:
    """[N, 1, B, S + B] boolean mask for the blocks anchored at `anchors` [N]."""
    i = mx.arange(block)[None, :, None]  # query row in block
    k = mx.arange(ctx_len)[None, None, :]  # context key position
    a = anchors[:, None, None]
    ctx_ok = mx.broadcast_to(k < a, (anchors.shape[0], block, ctx_len))
    if attn.window is not None:
        ctx_ok = ctx_ok & ((a + i) - k < attn.window)
    kb = mx.arange(block)[None, None, :]
    blk_ok = (kb <= i) if attn.causal else mx.ones((1, block, block), dtype=mx.bool_)
    blk_ok = mx.broadcast_to(blk_ok, (anchors.shape[0], block, block))
    return mx.concatenate([ctx_ok, blk_ok], axis=-1)[:, None]


def dropout(x: mx.array, p: float) -> mx.array:
    """Inverted dropout (training only; p = 0 is the identity)."""
    if p <= 0:
        return x
    return x * mx.random.bernoulli(1.0 - p, x.shape).astype(x.dtype) / (1.0 - p)


def block_hidden(drafter: Drafter, b: Blocks, drop: float = 0.0) -> mx.array:
    """Final-normed hidden states of every block row: [b*n, B, H] (sequence-major). `drop`:
    dropout on the context rows and on every attention / MLP output (against memorising the
    training sequences: the drafter is data-bound)."""
    t = drafter.target
    anchors, block_ids, _ = b.flat()
    x = t.embed(block_ids) * (t.embed_scale * drafter.config.input_embedding_scale)
    ctx = dropout(drafter.context(b.features), drop)
    seqs, n, block = b.block_ids.shape
    for layer in drafter.layers:
        attn = layer.self_attn
        ck, cv = attn.project_kv(ctx, drafter.rope, 0)  # [b, kv, S, d], shared by n blocks
        shape = (seqs, n, *ck.shape[1:])
        ck, cv = (
            mx.broadcast_to(c[:, None], shape).reshape(seqs * n, *shape[2:]) for c in (ck, cv)
        )
        mask = _visibility(attn, anchors, ctx.shape[1], block)

        def core(u, attn=attn, ck=ck, cv=cv, mask=mask):
            bk, bv = attn.project_kv(u, drafter.rope, anchors)
            q = attn.project_q(u, drafter.rope, anchors)
            return dropout(
                attn.attend(
                    q, mx.concatenate([ck, bk], axis=2), mx.concatenate([cv, bv], axis=2), mask
                ),
                drop,
            )

        x = layer.forward(x, core, lambda u, mlp=layer.mlp: dropout(mlp(u), drop))
    return drafter.norm(x)


def _head_logits(drafter: Drafter, h: mx.array, head_weight: mx.array | None) -> mx.array:
    if head_weight is None:
        return drafter.logits(h)
    return drafter.finish_logits(h @ head_weight.T)


@dataclass
class VocabSubset:
    """Training softmax over `ids` (sorted full-vocab ids); `remap[full_id]` = subset index."""

    ids: mx.array
    remap: mx.array
    head_weight: mx.array  # [len(ids), H] rows of the frozen LM head


@dataclass
class Teacher:
    """The target's next-token logits from its last decoder layer's output (the last slice of
    the cached features): head(final_norm(h)), over the training softmax's vocabulary."""

    final_norm: Callable[[mx.array], mx.array]
    head_weight: mx.array  # [V or len(subset), H]
    unscale: mx.array  # [H]: undoes the feature scaling of the last slice

    def logits(self, b: Blocks) -> mx.array:
        """[b*n, B-1, V'] logits for x_{a+1} .. x_{a+B-1} (rows a .. a+B-2 of the sequence)."""
        seqs, n, block = b.block_ids.shape
        h = self.unscale.shape[0]
        rows = (b.anchors[..., None] + mx.arange(block - 1)).reshape(seqs, -1, 1)
        hid = mx.take_along_axis(b.features[..., -h:], rows, axis=1) * self.unscale
        z = self.final_norm(hid) @ self.head_weight.T
        return mx.stop_gradient(z.reshape(seqs * n, block - 1, -1))


def loss_terms(
    drafter: Drafter,
    b: Blocks,
    weights: mx.array,
    subset: VocabSubset | None,
    selector_weight: float = 1.0,
    teacher: Teacher | None = None,
    distill_weight: float = 0.0,
    drop: float = 0.0,
) -> tuple[mx.array, dict]:
    """(total loss, parts) for a batch of blocks (`drop`: dropout rate, see block_hidden)."""
    _, block_ids, gold = b.flat()
    h = block_hidden(drafter, b, drop)[:, 1:]  # [N, B-1, H]
    logits = _head_logits(drafter, h, None if subset is None else subset.head_weight)
    labels = gold if subset is None else subset.remap[gold]
    ce = nn.losses.cross_entropy(logits, labels)  # [n, B-1]
    if b.mask is not None:  # unsupervised positions weigh nothing
        weights = weights * b.mask.reshape(ce.shape)
    else:
        weights = mx.broadcast_to(weights, ce.shape)
    wsum = mx.maximum(weights.sum(), 1e-6)
    base = (ce * weights).sum() / wsum
    parts = {"base": base}
    total = base
    if teacher is not None and distill_weight > 0:
        log_p = nn.log_softmax(teacher.logits(b).astype(mx.float32), axis=-1)
        kl = (mx.exp(log_p) * (log_p - nn.log_softmax(logits, axis=-1))).sum(axis=-1)
        parts["distill"] = (kl * weights).sum() / wsum
        total = total + distill_weight * parts["distill"]
    if drafter.config.version == 2 and selector_weight > 0:
        sel = drafter.candidate_selector
        cand, unary = sel.candidates(logits)  # the candidates drafting walks
        cand_full = cand if subset is None else subset.ids[cand]
        prev = mx.concatenate([block_ids[:, :1], gold[:, :-1]], axis=1)
        proj = sel.hidden_projection(h) * sel.predecessor_codebook[prev]  # [n, B-1, r]
        edges = (proj[..., None, :] @ sel.successor_codebook[cand_full].swapaxes(-1, -2))[..., 0, :]
        scores = unary.astype(mx.float32) + edges
        hit = cand_full == gold[..., None]
        present = hit.any(axis=-1).astype(mx.float32)
        target = mx.argmax(hit.astype(mx.int32), axis=-1)
        sce = nn.losses.cross_entropy(scores, target) * present
        sel_loss = (sce * weights).sum() / mx.maximum((present * weights).sum(), 1e-6)
        parts["selector"] = sel_loss
        total = total + selector_weight * sel_loss
    return total, parts


def proxy_acceptance(drafter: Drafter, b: Blocks) -> tuple[float, list[float]]:
    """Teacher-forced τ: mean over blocks of 1 + leading drafts equal to the labels (full
    vocabulary, the real selector walk). Exact for greedy when the sequence is the target's
    own greedy output. Also per-position accuracy."""
    _, block_ids, gold = b.flat()
    h = block_hidden(drafter, b)[:, 1:]
    logits = drafter.logits(h)
    if drafter.config.version == 2:
        drafts = drafter.select(h, logits, block_ids[:, 0], 0.0).tokens
    else:
        drafts = mx.argmax(logits, axis=-1)
    ok = (drafts == gold).astype(mx.int32)
    lead = mx.cumprod(ok, axis=-1).sum(axis=-1)
    return float((lead + 1).astype(mx.float32).mean().item()), ok.astype(mx.float32).mean(
        0
    ).tolist()


def cosine_lr(
    step: int, total: int, peak: float, warmup_frac: float = 0.04, min_ratio: float = 0.1
) -> float:
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return peak * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
