"""The target's caches for several sequences at once, and per-row rollback after a verify.

Built on mlx-lm's batch caches: attention layers use `BatchKVCache` (left-padded rows, one
offset per row, so RoPE positions and the causal mask are each row's own); Gated-DeltaNet
layers use `ArraysCache` (one recurrent state per row, no padding needed). A verify forward
runs every row over the same width W, right-padded after its drafts (causal layers never let
a row's real positions see its right padding). Row i then keeps `keeps[i]` of its W rows:
- attention: trim every row to max(keeps), then shift each shorter row right by what it
  drops, so its rejected tail becomes left padding (`prepare(right_padding=)` + `finalize()`).
  The shift keeps each row's columns in position order, which a leaving row's session needs
  (trimming a single-sequence cache drops its last columns).
- Gated-DeltaNet: recompute the recurrence from the pre-verify state with the steps past
  keeps[i] masked out (a masked step leaves the state unchanged), and take each row's conv
  window at its own end.
Other recurrent layers (generic replay) and rotating caches cannot be rolled back per row
exactly here: `batchable` says no and the engine runs such targets one request at a time.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import gated_delta
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache

from . import gdn
from .adapter import Forward, TargetAdapter

# Compact the batch's shared left padding once every row carries at least this much.
_COMPACT_AT = 64


def batchable(adapter: TargetAdapter) -> str | None:
    """None when every layer's cache can be batched and rolled back per row; else why not."""
    for i, c in enumerate(adapter.make_cache()):
        if type(c) is KVCache:
            continue
        mixer = getattr(adapter.layers[i], "linear_attn", None)
        if type(c) is ArraysCache and gdn.supports(mixer):
            continue
        return (
            f"layer {i} uses {type(c).__name__}"
            f"{'' if mixer is None else ' (' + type(mixer).__name__ + ')'}, "
            "which has no exact per-row rollback"
        )
    return None


def merge(row_caches: list[list]) -> list:
    """Single-sequence caches (one list per row, as after prefill) -> one batch cache list."""
    return [type(layer[0]).merge(list(layer)) for layer in zip(*row_caches)]


def extend(batch: list | None, rows: list) -> list:
    """Append the rows of batch cache `rows` to `batch` (None: start one)."""
    if batch is None:
        return rows
    for c, o in zip(batch, rows):
        c.extend(o)
    return batch


def extract(batch: list, i: int) -> list:
    """Row i as single-sequence caches (its padding dropped), as a prefill alone leaves them:
    `KVCache`s holding its positions, `ArraysCache`s holding its recurrent state."""
    return [c.extract(i) for c in batch]


def keep_rows(batch: list, indices: list[int]) -> None:
    """Drop every row not in `indices` (in their new order)."""
    idx = mx.array(indices)
    for c in batch:
        c.filter(idx)


def rollback(batch: list, fwd: Forward, keeps: list[int], width: int) -> None:
    """Row i keeps the first keeps[i] of the `width` rows the verify forward `fwd` added."""
    recurrent = {id(g.cache) for g in fwd.capture.gdn}
    if fwd.capture.replays:
        raise RuntimeError("generic recurrent layers cannot be rolled back per row")
    longest = max(keeps)
    shift = [longest - k for k in keeps]
    attention = [c for c in batch if id(c) not in recurrent]
    for c in attention:
        c.trim(width - longest)
        if any(shift):
            c.prepare(right_padding=shift)
            c.finalize()
    _compact(attention)
    if fwd.capture.gdn and min(keeps) < width:
        keep = mx.array(keeps)
        for g in fwd.capture.gdn:
            _rollback_gdn(g, keep, width)


def _compact(attention: list[BatchKVCache]) -> None:
    """Drop the leading columns that are padding in every row (they only cost attention).
    Every attention layer holds the same rows and padding, so one read decides for all."""
    if not attention or attention[0].keys is None:
        return
    pad = int(mx.min(attention[0].left_padding).item())
    if pad < _COMPACT_AT:
        return
    for c in attention:
        c.keys, c.values = c.keys[..., pad:, :], c.values[..., pad:, :]
        c._idx -= pad
        c.left_padding = c.left_padding - pad


def _rollback_gdn(r: gdn.GDNRecord, keep: mx.array, width: int) -> None:
    steps = mx.arange(width)[None, :] < keep[:, None]
    mask = steps if r.mask is None else (steps & r.mask)
    _, state = gated_delta.gated_delta_update(
        r.q, r.k, r.v, r.a, r.b, r.A_log, r.dt_bias, r.state, mask
    )
    r.cache[1] = state
    window = (keep[:, None] + mx.arange(r.kernel - 1)[None, :])[..., None]
    r.cache[0] = mx.take_along_axis(r.conv_input, window, axis=1)
