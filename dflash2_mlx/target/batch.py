"""The target's caches for several sequences at once, and per-row rollback after a verify.

Built on mlx-lm's batch caches: attention layers use `BatchKVCache` (left-padded rows, one
offset per row, so RoPE positions and the causal mask are each row's own); Gated-DeltaNet
layers use `ArraysCache` (one recurrent state per row, no padding needed). A verify forward
runs every row over the same width W, right-padded after its drafts (causal layers never let
a row's real positions see its right padding). Row i then keeps `keeps[i]` of its W rows:
- attention: trim every row to max(keeps); a shorter row's rejected tail (s columns) is then
  filled with its s oldest columns, which become left padding. That moves O(W) columns a
  round, where shifting the whole row right (mlx-lm's `finalize`) moves all of them. Keys are
  stored after RoPE and causal attention is order-free under its mask, so the order of a
  row's columns does not matter while it is batched; `BatchCache.order` records each column's
  position so that a leaving row is handed back in position order (a single-sequence cache
  trims its last columns). A sliding-window mask measures distance in columns: targets with
  one (`windowed`) shift whole rows right instead, keeping every row in position order.
- Gated-DeltaNet: recompute the recurrence from the pre-verify state with the steps past
  keeps[i] masked out (a masked step leaves the state unchanged), and take each row's conv
  window at its own end.
Other recurrent layers (generic replay) and rotating caches cannot be rolled back per row
exactly here: `batchable` says no and the engine runs such targets one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models import gated_delta
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from . import gdn
from .adapter import Forward, TargetAdapter

# Compact the batch's shared left padding once every row carries at least this much.
_COMPACT_AT = 64
_PAD = -1  # `order` entry of a padding column


# Families whose attention a per-row batch mask does not fit, whatever their caches.
_UNBATCHABLE_FAMILIES = {
    # scores are [B, kv heads, repeats, L, S]: a [B, 1, L, S] mask meets B at the kv heads
    # (mlx-lm's own batch generation is wrong on it too)
    "gemma2": "gemma2 adds its mask to 5-D grouped attention scores, which a per-row mask "
    "does not broadcast over"
}


def batchable(adapter: TargetAdapter) -> str | None:
    """None when every layer's cache can be batched and rolled back per row; else why not."""
    if adapter.model_type in _UNBATCHABLE_FAMILIES:
        return _UNBATCHABLE_FAMILIES[adapter.model_type]
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


@dataclass
class BatchCache:
    """One batch cache per target layer (`layers`, what the target's forward takes) and,
    for its attention layers (all laid out alike), the position of every column of every
    row (`order`, rows x columns, -1 for padding). Leading -1s are a row's left padding."""

    layers: list
    order: np.ndarray

    @property
    def attention(self) -> list[BatchKVCache]:
        return [c for c in self.layers if isinstance(c, BatchKVCache)]

    def left_padding(self) -> np.ndarray:
        valid = self.order != _PAD
        return np.where(valid.any(axis=1), valid.argmax(axis=1), self.order.shape[1])

    def lengths(self) -> np.ndarray:
        return (self.order != _PAD).sum(axis=1)


def merge(row_caches: list[list]) -> BatchCache:
    """Single-sequence caches (one list per row, as after prefill) -> one batch cache."""
    layers = [type(layer[0]).merge(list(layer)) for layer in zip(*row_caches)]
    first = next((i for i, c in enumerate(layers) if isinstance(c, BatchKVCache)), None)
    sizes = [0 if first is None else row[first].size() for row in row_caches]
    longest = max(sizes)
    order = np.full((len(row_caches), longest), _PAD, dtype=np.int64)
    for i, n in enumerate(sizes):
        order[i, longest - n :] = np.arange(n)
    return BatchCache(layers, order)


def extend(batch: BatchCache | None, rows: BatchCache) -> BatchCache:
    """Append the rows of `rows` to `batch` (None: start one), both right-aligned."""
    if batch is None:
        return rows
    for c, o in zip(batch.layers, rows.layers):
        c.extend(o)
    width = max(batch.order.shape[1], rows.order.shape[1])

    def right_aligned(order: np.ndarray) -> np.ndarray:
        return np.pad(order, ((0, 0), (width - order.shape[1], 0)), constant_values=_PAD)

    batch.order = np.concatenate([right_aligned(batch.order), right_aligned(rows.order)])
    return batch


def extract(batch: BatchCache, i: int) -> list:
    """Row i as single-sequence caches (its padding dropped, its columns in position order),
    as a prefill alone leaves them: `KVCache`s holding its positions, `ArraysCache`s holding
    its recurrent state."""
    row = batch.order[i]
    columns = np.flatnonzero(row != _PAD)
    columns = columns[np.argsort(row[columns], kind="stable")]
    in_order = bool(np.all(np.diff(columns) == 1))
    index = mx.array(columns)
    out = []
    for c in batch.layers:
        if not isinstance(c, BatchKVCache) or in_order:
            out.append(c.extract(i))
            continue
        single = KVCache()
        single.keys = mx.contiguous(mx.take(c.keys[i : i + 1], index, axis=2))
        single.values = mx.contiguous(mx.take(c.values[i : i + 1], index, axis=2))
        single.offset = len(columns)
        out.append(single)
    return out


def keep_rows(batch: BatchCache, indices: list[int]) -> None:
    """Drop every row not in `indices` (in their new order)."""
    idx = mx.array(indices)
    before = [c._idx for c in batch.attention[:1]]
    for c in batch.layers:
        c.filter(idx)  # BatchKVCache.filter also drops the columns now padding in every row
    batch.order = batch.order[indices]
    if before:
        batch.order = batch.order[:, before[0] - batch.attention[0]._idx :]


def windowed(adapter: TargetAdapter) -> bool:
    """Some attention layers of the target see a sliding window. Its mask measures distance
    in cache columns, so a batched row's columns must stay in position order."""
    return any(isinstance(c, RotatingKVCache) for c in make_prompt_cache(adapter.model))


def rollback(
    batch: BatchCache, fwd: Forward, keeps: list[int], width: int, in_order: bool = False
) -> None:
    """Row i keeps the first keeps[i] of the `width` rows the verify forward `fwd` added.
    `in_order`: keep every row's columns in position order (a windowed target, `windowed`)."""
    if fwd.capture.replays:
        raise RuntimeError("generic recurrent layers cannot be rolled back per row")
    attention = batch.attention
    if attention:
        longest = max(keeps)
        shift = np.array([longest - k for k in keeps])
        new = batch.lengths()[:, None] + np.arange(longest)[None, :]
        new[np.arange(longest)[None, :] >= np.array(keeps)[:, None]] = _PAD
        batch.order = np.concatenate([batch.order, new], axis=1)
        for c in attention:
            c.trim(width - longest)
        end = batch.order.shape[1]
        if in_order or np.any(batch.left_padding() + 2 * shift > end):
            _shift_right(batch, attention, shift)  # (a row too short to refill its tail)
        elif shift.any():
            _refill(batch, attention, shift)
        _compact(batch, attention)
    if fwd.capture.gdn and min(keeps) < width:
        keep = mx.array(keeps)
        for g in fwd.capture.gdn:
            _rollback_gdn(g, keep, width)


def _shift_right(batch: BatchCache, attention: list[BatchKVCache], shift: np.ndarray) -> None:
    """Every row shifts right by what it rejected, so its rejected tail wraps around into its
    left padding (O(context) copies; the columns stay in position order)."""
    if not shift.any():
        return
    for c in attention:
        c.prepare(right_padding=shift.tolist())
        c.finalize()
    for i, s in enumerate(shift):
        batch.order[i] = np.roll(batch.order[i], s)  # the rolled-in tail is rejected: padding
        batch.order[i, :s] = _PAD


def _refill(batch: BatchCache, attention: list[BatchKVCache], shift: np.ndarray) -> None:
    """Row i's last shift[i] columns are rejected drafts: fill them with its shift[i] oldest
    columns and count those as left padding (O(width) copies; a row needs at least as many
    kept columns as rejected ones)."""
    order, end = batch.order, batch.order.shape[1]
    pad = batch.left_padding()
    most = int(shift.max())
    source = np.tile(np.arange(end - most, end), (len(shift), 1))
    for i, s in enumerate(shift):
        if s:
            source[i, most - s :] = np.arange(pad[i], pad[i] + s)
            order[i, end - s :] = order[i, pad[i] : pad[i] + s]
            order[i, pad[i] : pad[i] + s] = _PAD
    index = mx.array(source)[:, None, :, None]
    step = mx.array(shift)
    windows = [
        [mx.take_along_axis(a, index, axis=2) for a in (c.keys, c.values)] for c in attention
    ]
    mx.eval(windows)  # before the writes, so that each write can reuse its array's buffer
    for c, (keys, values) in zip(attention, windows):
        c.keys[..., end - most : end, :] = keys
        c.values[..., end - most : end, :] = values
        c.offset = c.offset - step
        c.left_padding = c.left_padding + step


def _compact(batch: BatchCache, attention: list[BatchKVCache]) -> None:
    """Drop the leading columns that are padding in every row (they only cost attention).
    Every attention layer holds the same rows and padding, so `order` decides for all."""
    if not attention or attention[0].keys is None:
        return
    pad = int(batch.left_padding().min())
    if pad < _COMPACT_AT:
        return
    for c in attention:
        c.keys, c.values = c.keys[..., pad:, :], c.values[..., pad:, :]
        c._idx -= pad
        c.left_padding = c.left_padding - pad
    batch.order = batch.order[:, pad:]


def _rollback_gdn(r: gdn.GDNRecord, keep: mx.array, width: int) -> None:
    steps = mx.arange(width)[None, :] < keep[:, None]
    mask = steps if r.mask is None else (steps & r.mask)
    _, state = gated_delta.gated_delta_update(
        r.q, r.k, r.v, r.a, r.b, r.A_log, r.dt_bias, r.state, mask
    )
    r.cache[1] = state
    window = (keep[:, None] + mx.arange(r.kernel - 1)[None, :])[..., None]
    r.cache[0] = mx.take_along_axis(r.conv_input, window, axis=1)
