"""The ops the drafter calls, each with its reference's signature: the custom kernel where the
dispatcher allows it (`_dispatch.Dispatcher.use_kernel`), else the reference, compiled.

Differentiable ops (dynamic_conv, pair_scores) run the kernel forward under `mx.custom_function`
whose VJP is the reference's, so training through them behaves as with the references.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from . import _launch
from . import _references as ref
from ._dispatch import current, execute


@functools.lru_cache(maxsize=None)
def _conv_fn(group_size: int):
    @mx.custom_function
    def conv(x, dynamic, base):
        return execute(_launch.conv_launch(x, dynamic, base, group_size))[0]

    @conv.vjp
    def conv_vjp(primals, cotangent, output):
        _, grads = mx.vjp(
            lambda x, d, b: ref.dynamic_conv(x, d, b, group_size), list(primals), [cotangent]
        )
        return tuple(grads)

    return conv


@mx.custom_function
def _pair_scores_fn(unary, hidden, pred_rows, succ_rows):
    return execute(_launch.pair_scores_launch(unary, hidden, pred_rows, succ_rows))[0]


@_pair_scores_fn.vjp
def _pair_scores_vjp(primals, cotangent, output):
    _, grads = mx.vjp(ref.pair_scores, list(primals), [cotangent])
    return tuple(grads)


def dynamic_conv(x: mx.array, dynamic: mx.array, base: mx.array, group_size: int) -> mx.array:
    """Same contract as `_references.dynamic_conv` (x [..., L, H]; dynamic [..., L, T, G];
    base [T, H]); the Metal kernel for two taps and fp32/fp16/bf16 with matching x/dynamic."""
    d = current()
    if d.active() and d.use_kernel(_launch.conv_launch(x, dynamic, base, group_size)):
        return _conv_fn(int(group_size))(x, dynamic, base)
    return ref.compiled_conv(int(group_size))(x, dynamic, base)


def pair_scores(
    unary: mx.array, hidden: mx.array, pred_rows: mx.array, succ_rows: mx.array
) -> mx.array:
    """Same contract as `_references.pair_scores` ([..., g, P, K] float32)."""
    d = current()
    if d.active() and d.use_kernel(_launch.pair_scores_launch(unary, hidden, pred_rows, succ_rows)):
        return _pair_scores_fn(unary, hidden, pred_rows, succ_rows)
    return ref.compiled_pair_scores()(unary, hidden, pred_rows, succ_rows)


def walk_with_uniforms(lattice: mx.array, temperature: float, uniforms: mx.array | None):
    """The walk with its sampling noise given (uniforms [..., g, K]; ignored when greedy)."""
    d = current()
    if d.active():
        launch = _launch.walk_launch(lattice, temperature, uniforms)
        if d.use_kernel(launch):
            outs = d.execute(launch)
            return outs[0], (outs[1] if temperature > 0 else None)
    return ref.compiled_walk(lattice, temperature, uniforms)


def walk(lattice: mx.array, temperature: float, key: mx.array | None = None):
    """Same contract as `_references.walk`: the sampled kernel takes the very uniforms the
    reference draws from `key`, so both paths make the same choices."""
    uniforms = None
    if temperature > 0:
        *lead, gamma, _, k = lattice.shape
        uniforms = ref.draw_walk_uniforms(tuple(lead), gamma, k, key)
    return walk_with_uniforms(lattice, temperature, uniforms)


def expected_walk_choices(lattice: mx.array, calibration: float) -> mx.array:
    """Same contract as `_references.expected_walk_choices`: the kernel also writes the
    values, the compiled reference skips them."""
    d = current()
    if d.active():
        launch = _launch.expected_walk_launch(lattice, calibration)
        if d.use_kernel(launch):
            return d.execute(launch)[0]
    return ref.compiled_expected_walk_choices(lattice, calibration)
