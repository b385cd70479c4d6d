"""Fast exact rollback for mlx-lm's Gated-DeltaNet mixer (qwen3_5 family).

The generic rollback re-runs a whole recurrent decoder layer over the accepted rows, which
re-reads its weights. Here the mixer's forward is mirrored step by step so that the inputs
of the delta rule and of the short conv are recorded during verify; on rollback only the
recurrence is recomputed over the kept rows (no matmul) and the conv state is sliced.
tests/test_rollback.py checks that the mirror equals mlx-lm's own module exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gated_delta


def supports(mixer) -> bool:
    """The qwen3_5 GatedDeltaNet layout this mirror follows (unsharded, unbatched cache)."""
    cls = type(mixer)
    return (
        cls.__name__ == "GatedDeltaNet"
        and cls.__module__.endswith(".qwen3_5")
        and getattr(mixer, "sharding_group", None) is None
        and all(hasattr(mixer, n) for n in ("in_proj_qkv", "in_proj_z", "conv1d", "A_log"))
    )


@dataclass
class GDNRecord:
    cache: object
    q: mx.array
    k: mx.array
    v: mx.array
    a: mx.array
    b: mx.array
    A_log: mx.array
    dt_bias: mx.array
    state: mx.array | None
    mask: mx.array | None
    conv_input: mx.array  # [B, K-1 + L, conv_dim]
    kernel: int


def forward(mod, inputs: mx.array, mask, cache, records: list[GDNRecord]) -> mx.array:
    """mlx-lm's GatedDeltaNet.__call__ (qwen3_5), recording the recurrence inputs."""
    B, S, _ = inputs.shape
    qkv = mod.in_proj_qkv(inputs)
    z = mod.in_proj_z(inputs).reshape(B, S, mod.num_v_heads, mod.head_v_dim)
    b = mod.in_proj_b(inputs)
    a = mod.in_proj_a(inputs)
    if cache is not None and cache[0] is not None:
        conv_state = cache[0]
    else:
        conv_state = mx.zeros((B, mod.conv_kernel_size - 1, mod.conv_dim), dtype=inputs.dtype)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    if cache is not None:
        cache[0] = mx.contiguous(conv_input[:, -(mod.conv_kernel_size - 1) :, :])
    conv_out = nn.silu(mod.conv1d(conv_input))
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [mod.key_dim, 2 * mod.key_dim], -1),
            [mod.num_k_heads, mod.num_k_heads, mod.num_v_heads],
            [mod.head_k_dim, mod.head_k_dim, mod.head_v_dim],
        )
    ]
    state = cache[1] if cache else None
    q, k = gated_delta.normalize_qk(q, k, inv_scale=mod.head_k_dim**-0.5, eps=1e-6)
    records.append(
        GDNRecord(
            cache,
            q,
            k,
            v,
            a,
            b,
            mod.A_log,
            mod.dt_bias,
            state,
            mask,
            conv_input,
            mod.conv_kernel_size,
        )
    )
    out, state = gated_delta.gated_delta_update(
        q, k, v, a, b, mod.A_log, mod.dt_bias, state, mask, use_kernel=not mod.training
    )
    if cache is not None:
        cache[1] = state
        cache.advance(S)
    out = mod.norm(out, z)
    return mod.out_proj(out.reshape(B, S, -1))


def rollback(r: GDNRecord, keep: int) -> None:
    """Set the cache to its state after the first `keep` rows of the recorded call."""
    n = keep
    _, state = gated_delta.gated_delta_update(
        r.q[:, :n],
        r.k[:, :n],
        r.v[:, :n],
        r.a[:, :n],
        r.b[:, :n],
        r.A_log,
        r.dt_bias,
        r.state,
        None if r.mask is None else r.mask[:, :n],
    )
    r.cache[1] = state
    r.cache[0] = mx.contiguous(r.conv_input[:, n : n + r.kernel - 1])
