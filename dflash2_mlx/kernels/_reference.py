"""The sampled walk with its randomness given (pure MLX), and how `walk` draws that randomness.

The sampled walk picks step t by Gumbel-max, argmax(logits - log(-log(u))), over uniforms u
[..., γ, K]: an exact sample of q = softmax(logits). The Metal kernel takes u as an input, so it
is deterministic and testable against `walk_with_uniforms`.

`draw_walk_uniforms(key)` draws u with the reference's keys (`split(key, γ)`, one per step) and
advances the global PRNG as the reference does when key is None. `selector.walk` samples with
`mx.random.categorical`; MLX 0.32 does that by Gumbel-max for batched distributions, so there the
two walks agree draw for draw, but for a single distribution (leading size 1, the inference case)
it uses an inverse-CDF path: same distribution, different draws. Sampled drafts are therefore
seed-reproducible on each path, not across DFLASH2_KERNELS=on/off; losslessness holds on both,
since the choice is always an exact sample of the returned q.
"""

from __future__ import annotations

import math
import struct

import mlx.core as mx

# mx.random.gumbel draws uniform(nextafter(0, 1), 1): the smallest positive float32.
_TINY = struct.unpack("<f", struct.pack("<I", 1))[0]


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
            choice = mx.argmax(logits + gumbel, axis=-1)
        else:
            choice = mx.argmax(scores, axis=-1)
        prev = choice.astype(mx.int32)
        picks.append(prev)
    picks = mx.stack(picks, axis=-1).reshape(*lead, gamma)
    q = mx.stack(qs, axis=1).reshape(*lead, gamma, k) if qs else None
    return picks, q
