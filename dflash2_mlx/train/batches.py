"""Training batches: the vocabulary subset, anchors and blocks of stored sequences
(regenerations labelled by their own next tokens, fixed text by the target: fixed_text.py)."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np

from ..errors import DFlash2Error
from .features import StoredSequence
from .fixed_text import block_labels
from .objective import Blocks, VocabSubset


def make_subset(tokens: list, head_w: mx.array, negatives: int, seed: int) -> VocabSubset:
    """The training softmax's vocabulary: every token of `tokens` (arrays or lists) plus
    `negatives` sampled others."""
    vocab = head_w.shape[0]
    seen = np.unique(np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens]))
    rng = np.random.default_rng(seed)
    others = np.setdiff1d(np.arange(vocab), seen)
    neg = rng.choice(others, size=min(negatives, len(others)), replace=False)
    ids = np.sort(np.concatenate([seen, neg])).astype(np.int32)
    remap = np.zeros(vocab, dtype=np.int32)
    remap[ids] = np.arange(len(ids), dtype=np.int32)
    ids_mx = mx.array(ids)
    return VocabSubset(ids_mx, mx.array(remap), head_w[ids_mx])


def sample_anchors(
    seq: StoredSequence, n: int, block: int, rng: random.Random, every: int | None = None
) -> list[int] | None:
    """n random anchors in the response (with replacement when it is short), or every
    `every`-th one; None when the response is shorter than a block."""
    lo, hi = max(seq.response_start - 1, 1), len(seq.tokens) - block
    if hi < lo:
        return None
    pool = range(lo, hi + 1)
    if every:
        return list(pool[::every])
    return sorted(rng.sample(pool, n) if len(pool) >= n else rng.choices(pool, k=n))


def make_blocks(
    seqs: list[StoredSequence],
    anchors: list[list[int]],
    block: int,
    mask_id: int,
    scale: mx.array,
    pad_to: int = 64,
    known: np.ndarray | None = None,
) -> Blocks:
    """One batch: features right-padded to a multiple of `pad_to` rows (fewer distinct shapes).
    Sequences with target labels (`greedy`, fixed text) get those labels and a mask of the
    exact ones (fixed_text.block_labels); `known` [V] bool masks labels outside the training
    softmax's vocabulary too. All sequences of a batch must be of one kind."""
    width = -(-max(len(s.tokens) for s in seqs) // pad_to) * pad_to
    feats = np.zeros((len(seqs), width, seqs[0].features.shape[1]), dtype=np.float16)
    fixed = seqs[0].greedy is not None
    if any((s.greedy is not None) != fixed for s in seqs):
        raise DFlash2Error("a batch mixes fixed text and regenerations; make one per kind")
    ids, labels, masks = [], [], []
    for i, (s, a_list) in enumerate(zip(seqs, anchors)):
        feats[i, : len(s.tokens)] = s.features
        ids.append([[int(s.tokens[a])] + [mask_id] * (block - 1) for a in a_list])
        if fixed:
            lab, m = block_labels(s.tokens, s.greedy, a_list, block)
            if known is not None:
                m = m * known[lab]
            labels.append(lab)
            masks.append(m)
        else:
            labels.append([s.tokens[a + 1 : a + block].tolist() for a in a_list])
    return Blocks(
        mx.array(feats).astype(mx.float32) * scale,
        mx.array(anchors, dtype=mx.int32),
        mx.array(ids),
        mx.array(np.array(labels, dtype=np.int32)),
        mx.array(np.stack(masks)) if fixed else None,
        fixed,
    )
