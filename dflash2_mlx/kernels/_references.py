"""The pure-MLX reference of each kernel, with the kernel op's signature: the oracle a kernel is
checked against, and the path taken wherever a kernel is not.

The references live in dflash2_mlx.drafter.conv / .selector and are imported on first use
(those modules import this package). Without Metal kernels they run compiled: they are chains
of small element-wise ops and gathers whose per-op dispatch dominates a draft round on the CPU
(measured: the drafter forward ~35% faster). Each is a pure function of its array arguments.
"""

from __future__ import annotations

import functools

import mlx.core as mx


def _conv():
    from ..drafter import conv
    return conv


def _selector():
    from ..drafter import selector
    return selector


def dynamic_conv(x: mx.array, dynamic: mx.array, base: mx.array, group_size: int) -> mx.array:
    return _conv().dynamic_conv(x, dynamic, base, group_size)


def pair_scores(unary: mx.array, hidden: mx.array, pred_rows: mx.array,
                succ_rows: mx.array) -> mx.array:
    return _selector().pair_scores(unary, hidden, pred_rows, succ_rows)


def walk_with_uniforms(lattice: mx.array, temperature: float, uniforms: mx.array | None):
    return _selector().walk_with_uniforms(lattice, temperature, uniforms)


def draw_walk_uniforms(lead: tuple[int, ...], gamma: int, k: int, key: mx.array | None):
    return _selector().draw_walk_uniforms(lead, gamma, k, key)


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
