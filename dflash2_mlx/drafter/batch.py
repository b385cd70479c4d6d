"""One drafter pass for several sequences (the batched engine's drafter rounds).

Each row has its own context cache (its own length and positions) and its own new target
features. Rows drafting blocks of the same length run through the drafter together: the new
features are right-padded to the longest, projected once per layer (each row roped at its own
offset) and only each row's real rows are appended to its cache; the cached context keys are
left-padded to the longest and masked. The block rows, the MLP/conv sublayers and the LM head
run once for all rows. The path selector (or argmax / draw) then runs per row with that row's
sampling and key, exactly as the single-sequence `Drafter.draft_block`.

Drafts never change what is committed (the target verifies them); a batched pass gives the
single pass's drafts up to the float rounding of differently shaped matmuls.
Drafters with causal or windowed layers (their masks depend on each row's context length)
draft row by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from ..sampling import SamplingParams
from .attention import ContextCache, DrafterAttention
from .model import DraftBlock, Drafter


@dataclass
class DraftRequest:
    """One row's drafter round: as the arguments of `Drafter.draft_block`."""

    anchor: int
    length: int  # tokens in the block (anchor included): length - 1 drafts
    features: mx.array  # [1, S, N_f * H] target features the row's drafter has not seen
    cache: list[ContextCache]
    sampling: SamplingParams
    key: mx.array | None = None


def batchable(drafter: Drafter) -> bool:
    """True when every drafter layer sees the whole context and block (no causal mask, no
    window), so rows of different context lengths only need their padding masked."""
    return all(not (x.self_attn.causal or x.self_attn.window) for x in drafter.layers)


def draft_rows(drafter: Drafter, requests: list[DraftRequest]) -> list[DraftBlock]:
    """Each request's DraftBlock; rows with blocks of one length share one drafter pass."""
    if len(requests) < 2 or not batchable(drafter):
        return [_alone(drafter, r) for r in requests]
    out: list[DraftBlock | None] = [None] * len(requests)
    for length in sorted({r.length for r in requests}):
        group = [i for i, r in enumerate(requests) if r.length == length]
        if len(group) == 1:
            out[group[0]] = _alone(drafter, requests[group[0]])
            continue
        for i, block in zip(group, _together(drafter, [requests[i] for i in group])):
            out[i] = block
    return out


def _alone(drafter: Drafter, r: DraftRequest) -> DraftBlock:
    return drafter.draft_block(r.anchor, r.length, r.features, r.cache, r.sampling, r.key)


def _together(drafter: Drafter, reqs: list[DraftRequest]) -> list[DraftBlock]:
    cfg, t = drafter.config, drafter.target
    block = mx.array([[r.anchor] + [cfg.mask_token_id] * (r.length - 1) for r in reqs])
    x = t.embed(block) * (t.embed_scale * cfg.input_embedding_scale)
    sizes = [r.features.shape[1] for r in reqs]
    widest = max(sizes)
    feats = mx.concatenate(
        [mx.pad(r.features, [(0, 0), (0, widest - s), (0, 0)]) for r, s in zip(reqs, sizes)]
    )
    ctx = drafter.context(feats)
    for i, layer in enumerate(drafter.layers):
        caches = [r.cache[i] for r in reqs]
        attend = _attention(layer.self_attn, ctx, sizes, caches, drafter.rope)
        x = layer.forward(x, attend)
    hidden = drafter.norm(x)[:, 1:]
    logits = drafter.draft_logits(hidden)
    return [
        drafter.finish_block(hidden[i], logits[i], r.anchor, r.sampling, r.key)
        for i, r in enumerate(reqs)
    ]


def _attention(
    attn: DrafterAttention, ctx: mx.array, sizes: list[int], caches: list[ContextCache], rope
):
    """The attention core of one layer for all rows (called once by the layer)."""

    def core(u: mx.array) -> mx.array:
        ck, cv = attn.project_kv(ctx, rope, mx.array([c.offset for c in caches]))
        held = []
        for i, (c, s) in enumerate(zip(caches, sizes)):
            held.append(c.append(ck[i : i + 1, :, :s], cv[i : i + 1, :, :s]))
            c.offset += s
        at = mx.array([c.offset for c in caches])
        bk, bv = attn.project_kv(u, rope, at)
        q = attn.project_q(u, rope, at)
        longest = max(k.shape[2] for k, _ in held)
        left = [longest - k.shape[2] for k, _ in held]
        keys = _rows_left_padded([k for k, _ in held], left, bk)
        values = _rows_left_padded([v for _, v in held], left, bv)
        mask = None
        if any(left):
            visible = mx.arange(longest + u.shape[1])[None, :] >= mx.array(left)[:, None]
            mask = visible[:, None, None, :]
        return attn.attend(q, keys, values, mask)

    return core


def _rows_left_padded(context: list[mx.array], left: list[int], block: mx.array) -> mx.array:
    """[B, h, longest + L, d]: each row's context [1, h, n, d] after `left` zero rows, then
    the block's rows; every row is written once into one buffer (no pad-then-concatenate)."""
    b, h, length, d = block.shape
    out = mx.zeros((b, h, left[0] + context[0].shape[2] + length, d), block.dtype)
    for i, (rows, pad) in enumerate(zip(context, left)):
        out[i : i + 1, :, pad : pad + rows.shape[2]] = rows
    out[:, :, -length:] = block
    return out
