"""The pure-MLX reference of each kernel, with the kernel op's signature: the oracle a kernel is
checked against, and the path taken wherever a kernel is not.

- `dynamic_conv`: DFlash2's grouped dynamic causal convolution over block positions:
  coefficient[t, k, c] = base[k, c] + dynamic[t, k, c // g]; taps read rows t-k of the same
  block and never cross the block start (rows before 0 are zero).
- `pair_scores`: the candidate selector's K x K pair scores per drafted row.
- `walk` / `walk_with_uniforms`: the selector's walk over those lattices, greedy or sampled
  (Gumbel-max over uniforms drawn from a key, so the Metal walk, which takes the uniforms, makes
  the very same draws).
- `expected_walk`: the path with the most accepted drafts expected under the lattice's own
  conditionals (greedy drafts take it), with the backward values the Metal kernel keeps.

The drafter (drafter/conv.py, drafter/selector.py) calls the ops through `kernels`, which
dispatches here or to a kernel. Without Metal kernels the references run compiled: they are
chains of small element-wise ops and gathers whose per-op dispatch dominates a draft round on
the CPU (measured: the drafter forward ~35% faster). Each is a pure function of its array
arguments.
"""

from __future__ import annotations

import functools
import math
import struct

import mlx.core as mx

# mx.random.gumbel draws uniform(nextafter(0, 1), 1): the smallest positive float32.
_TINY = struct.unpack("<f", struct.pack("<I", 1))[0]


def dynamic_conv(x: mx.array, dynamic: mx.array, base: mx.array, group_size: int) -> mx.array:
    """x [..., L, H]; dynamic [..., L, T, G]; base [T, H] -> [..., L, H].

    Reference op; the Metal kernel in metal/dynamic_conv.metal has this signature
    (`kernels.dynamic_conv` dispatches between the two).
    """
    *lead, length, hidden = x.shape
    taps, groups = base.shape[0], hidden // group_size
    xg = x.reshape(*lead, length, groups, group_size)
    out = None
    for k in range(min(taps, length)):
        shifted = (
            xg
            if k == 0
            else mx.concatenate(
                [mx.zeros_like(xg[..., :k, :, :]), xg[..., : length - k, :, :]], axis=-3
            )
        )
        coeff = base[k].reshape(groups, group_size).astype(x.dtype) + dynamic[..., k, :, None]
        term = coeff * shifted
        out = term if out is None else out + term
    return out.reshape(x.shape)


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


def draw_walk_uniforms(lead: tuple[int, ...], gamma: int, k: int, key: mx.array | None) -> mx.array:
    """The uniforms [*lead, gamma, k] that `walk(..., key)` consumes (key None: the
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


def expected_walk(lattice: mx.array, calibration: float) -> tuple[mx.array, mx.array]:
    """The path through lattices [..., g, P, K] (row 0: predecessor 0, the anchor; row t > 0
    indexed by the previous choice) that maximises the expected number of leading drafts
    accepted, E = p1 + p1 p2 + ..., with p_t(b | a) = softmax(lattice[t, a] / calibration):
    V_t(a) = max_b p_t(b | a) (1 + V_{t+1}(b)) from the last row back (V_g = 0), then the
    maximisers forward from predecessor 0. Returns (choices [..., g] int32, values [..., g, P]
    float32 = V_t(a) for every row a, step 0's included; values[..., 0, 0] is E of the path).
    Ties go to the lowest index; a NaN gain is never chosen but makes its value NaN.
    Reference of metal/walk_expected.metal, which writes both (the op is
    `expected_walk_choices`: the choices alone)."""
    *lead, gamma, preds, k = lattice.shape
    probs = mx.softmax(lattice.reshape(-1, gamma, preds, k).astype(mx.float32) / calibration, -1)
    n = probs.shape[0]
    value = mx.zeros((n, k), dtype=mx.float32)
    best, values = [None] * gamma, [None] * gamma
    for t in range(gamma - 1, -1, -1):
        gain = probs[:, t] * (1.0 + value[:, None, :k])  # [n, P, K]: candidate b is row b of t+1
        best[t] = argmax_skipping_nan(gain).astype(mx.int32)  # [n, P]
        value = values[t] = mx.max(gain, axis=-1)  # V_t: NaN if any gain is NaN
    rows = mx.arange(n)
    prev = best[0][:, 0]
    picks = [prev]
    for t in range(1, gamma):
        prev = best[t][rows, prev]
        picks.append(prev)
    choices = mx.stack(picks, axis=-1).reshape(*lead, gamma)
    return choices, mx.stack(values, axis=1).reshape(*lead, gamma, preds)


@functools.lru_cache(maxsize=None)
def compiled_conv(group_size: int):
    return mx.compile(lambda x, dynamic, base: dynamic_conv(x, dynamic, base, group_size))


@functools.lru_cache(maxsize=None)
def compiled_pair_scores():
    return mx.compile(pair_scores)


@functools.lru_cache(maxsize=64)
def _compiled_walk(temperature: float):
    if temperature <= 0:
        return mx.compile(lambda lattice: walk_with_uniforms(lattice, 0.0, None)[0])
    return mx.compile(lambda lattice, uniforms: walk_with_uniforms(lattice, temperature, uniforms))


def compiled_walk(lattice: mx.array, temperature: float, uniforms: mx.array | None):
    """walk_with_uniforms, compiled per temperature."""
    if temperature <= 0:
        return _compiled_walk(0.0)(lattice), None
    return tuple(_compiled_walk(float(temperature))(lattice, uniforms))


def expected_walk_choices(lattice: mx.array, calibration: float) -> mx.array:
    """The choices [..., g] (int32) of `expected_walk`. Reference op: `kernels.
    expected_walk_choices` has this signature and dispatches between the two."""
    return expected_walk(lattice, calibration)[0]


@functools.lru_cache(maxsize=16)
def _compiled_expected_walk_choices(calibration: float):
    return mx.compile(lambda lattice: expected_walk_choices(lattice, calibration))


def compiled_expected_walk_choices(lattice: mx.array, calibration: float) -> mx.array:
    """expected_walk_choices compiled per calibration (the values are not computed)."""
    return _compiled_expected_walk_choices(float(calibration))(lattice)
