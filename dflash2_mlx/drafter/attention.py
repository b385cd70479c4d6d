"""KV-injection attention of the drafter, with its context cache.

Block queries attend to [cached context ; new context ; block] keys. Context rows come from
the target's fused features and are cached per layer; block rows are recomputed every round.
Full-attention layers see everything (bidirectional block); sliding layers see context keys
less than `window` positions back; causal layers (explicit `is_causal`, or sliding by default)
see block keys at or before the query.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class ContextCache:
    """Roped context K/V of one drafter layer. `offset` = absolute position of the next row.

    Rows live in buffers grown `STEP` rows at a time and written in place (as mlx-lm's
    KVCache), so a round costs its new rows, not a copy of the whole context. With a window,
    only the last `window - 1` rows are kept: no block query can see further.
    """

    STEP = 256

    def __init__(self, window: int | None = None):
        self.keep = None if window is None else window - 1
        self.buffers: tuple[mx.array, mx.array] | None = None
        self.length = 0  # rows of the buffers that hold context
        self.offset = 0

    @property
    def keys(self) -> mx.array | None:
        return None if self.buffers is None else self.buffers[0][:, :, : self.length]

    @property
    def values(self) -> mx.array | None:
        return None if self.buffers is None else self.buffers[1][:, :, : self.length]

    def append(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Keep new context rows; the whole context K/V."""
        if self.keep is None:
            self.length = self._write(keys, values)
            return self.keys, self.values
        # a window holds at most `keep` rows: copying them costs little
        keys, values = _joined(self.keys, keys), _joined(self.values, values)
        if keys.shape[2] > self.keep:
            keys, values = keys[:, :, -self.keep :], values[:, :, -self.keep :]
        self.buffers, self.length = (keys, values), keys.shape[2]
        return keys, values

    def with_block(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """The context K/V followed by a block's rows, which are not kept (the next append
        writes over them)."""
        if self.keep is not None:
            return _joined(self.keys, keys), _joined(self.values, values)
        end = self._write(keys, values)
        k, v = self.buffers
        return k[:, :, :end], v[:, :, :end]

    def _write(self, keys: mx.array, values: mx.array) -> int:
        """Write rows in place after the context; the buffers' rows in use after them."""
        end = self.length + keys.shape[2]
        if self.buffers is None or end > self.buffers[0].shape[2]:
            self._grow(end, keys, values)
        k, v = self.buffers
        k[:, :, self.length : end] = keys
        v[:, :, self.length : end] = values
        self.buffers = k, v
        return end

    def _grow(self, rows: int, keys: mx.array, values: mx.array) -> None:
        size = -(-rows // self.STEP) * self.STEP
        grown = []
        for new, old in zip((keys, values), (self.keys, self.values)):
            b, h, _, d = new.shape
            buf = mx.zeros((b, h, size, d), new.dtype)
            if self.length:
                buf[:, :, : self.length] = old
            grown.append(buf)
        self.buffers = grown[0], grown[1]

    def compact(self) -> None:
        """Buffers cut to the rows held where the spare room is large (a kept entry)."""
        if self.buffers is not None and self.buffers[0].shape[2] - self.length > self.length // 8:
            self.buffers = mx.contiguous(self.keys), mx.contiguous(self.values)

    def trim(self, n: int) -> None:
        """Forget the last n positions (rows already outside the window are not restored)."""
        n = min(n, self.offset)
        self.offset -= n
        self.length -= min(n, self.length)

    @property
    def state(self):
        return self.keys, self.values


def _joined(held: mx.array | None, new: mx.array) -> mx.array:
    return new if held is None else mx.concatenate([held, new], axis=2)


class DrafterAttention(nn.Module):
    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        bias: bool,
        causal: bool,
        window: int | None,
    ):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.causal, self.window = causal, window
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=eps)

    def project_kv(self, x: mx.array, rope, offset) -> tuple[mx.array, mx.array]:
        """Rows [B, N, H] -> roped keys and values [B, kv_heads, N, d]; offset int or [B]."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(b, n, self.kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(b, n, self.kv_heads, -1).transpose(0, 2, 1, 3)
        return rope(k, offset=offset), v

    def project_q(self, x: mx.array, rope, offset) -> mx.array:
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, n, self.heads, -1)).transpose(0, 2, 1, 3)
        return rope(q, offset=offset)

    def attend(self, q: mx.array, keys: mx.array, values: mx.array, mask) -> mx.array:
        b, _, length, _ = q.shape
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))

    def mask(self, ctx_len: int, length: int):
        """Boolean [L, ctx_len + L] visibility, or None when everything is visible."""
        if not self.causal and self.window is None:
            return None
        q = mx.arange(length)[:, None]
        k = mx.arange(ctx_len + length)[None, :]
        in_block = k >= ctx_len
        block_ok = (k - ctx_len <= q) if self.causal else in_block
        ctx_ok = ~in_block
        if self.window is not None:
            ctx_ok = ctx_ok & ((ctx_len + q) - k < self.window)
        return (in_block & block_ok) | ctx_ok

    def __call__(self, x: mx.array, ctx: mx.array, rope, cache: ContextCache) -> mx.array:
        """x [B, L, H] block rows at positions cache.offset + S ...; ctx [B, S, H] new context."""
        b, length, _ = x.shape
        s = ctx.shape[1]
        if cache.keep is not None and s > cache.keep:  # rows no query can see: skip them
            cache.offset += s - cache.keep
            ctx, s = ctx[:, -cache.keep :], cache.keep
        ck, cv = self.project_kv(ctx, rope, cache.offset)
        cache.offset += s
        cache.append(ck, cv)
        held = cache.length
        bk, bv = self.project_kv(x, rope, cache.offset)
        q = self.project_q(x, rope, cache.offset)
        keys, values = cache.with_block(bk, bv)
        return self.attend(q, keys, values, self.mask(held, length))
