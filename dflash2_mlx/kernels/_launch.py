"""Launch plans: everything a kernel call needs (inputs, template, grid, output shapes), or None
where the shape/dtype is not supported and the pure-MLX reference must be used.

Plans are pure MLX (no Metal): the runtime executes them with `mx.fast.metal_kernel`, and the CPU
harness in tests/harness executes the very same plans with a C++ build of the same bodies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ._specs import DYNAMIC_CONV, PAIR_SCORES, WALK_EXPECTED, WALK_GREEDY, WALK_SAMPLED, KernelSpec

FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
CONV_TAPS = 2  # the dynamic-conv body is the two-tap form (T_c = 2)
_MAX_ELEMENTS = 2**31 - 1  # bodies index with 32-bit unsigned arithmetic
# MLX passes an input under this many elements in the constant address space, which makes it
# another kernel instantiation than the one the self-check tried (see `device_buffers_only`).
CONSTANT_BUFFER_LIMIT = 8


@dataclass(frozen=True)
class Launch:
    spec: KernelSpec
    inputs: tuple[mx.array, ...]
    template: tuple[tuple[str, Any], ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[mx.Dtype, ...]

    @property
    def input_dtypes(self) -> tuple[mx.Dtype, ...]:
        """The dtypes that, with the template, pick the compiled instantiation."""
        return tuple(a.dtype for a in self.inputs)

    @property
    def template_values(self) -> tuple[tuple[str, int], ...]:
        """The template's values other than dtypes (the conv's GROUP): with the input dtypes,
        they pick the instantiation a self-check must have run."""
        return tuple((n, v) for n, v in self.template if isinstance(v, int))

    def kwargs(self) -> dict:
        """Keyword arguments for the `mx.fast.metal_kernel` callable."""
        return dict(
            inputs=list(self.inputs),
            template=list(self.template),
            grid=self.grid,
            threadgroup=self.threadgroup,
            output_shapes=[list(s) for s in self.output_shapes],
            output_dtypes=list(self.output_dtypes),
        )


def device_buffers_only(launch: Launch) -> bool:
    """Every array input in device memory (scalars aside): the instantiation the per-dtype
    self-check runs. Smaller inputs take the reference (they are never a hot path)."""
    return all(a.ndim == 0 or a.size >= CONSTANT_BUFFER_LIMIT for a in launch.inputs)


def _fits(*arrays: mx.array) -> bool:
    return all(0 < a.size <= _MAX_ELEMENTS for a in arrays)


def conv_supported(x: mx.array, dynamic: mx.array, base: mx.array, group_size: int) -> bool:
    """Two taps, fp32/fp16/bf16 with x and dynamic of one dtype, H divisible by the group."""
    if x.ndim < 2 or x.dtype not in FLOAT_DTYPES or dynamic.dtype != x.dtype:
        return False
    if base.dtype not in FLOAT_DTYPES or group_size <= 0:
        return False
    *lead, length, hidden = x.shape
    if hidden % group_size or tuple(base.shape) != (CONV_TAPS, hidden):
        return False
    groups = hidden // group_size
    return tuple(dynamic.shape) == (*lead, length, CONV_TAPS, groups) and _fits(x, dynamic)


def conv_launch(x: mx.array, dynamic: mx.array, base: mx.array, group_size: int) -> Launch | None:
    """dynamic_conv(x [..., L, H], dynamic [..., L, 2, H/g], base [2, H], g) on the kernel."""
    if not conv_supported(x, dynamic, base, group_size):
        return None
    hidden = x.shape[-1]
    rows = x.size // hidden
    return Launch(
        DYNAMIC_CONV,
        (x, dynamic, base.astype(x.dtype)),  # the reference casts base to x.dtype too
        (("T", x.dtype), ("GROUP", int(group_size))),
        (hidden, rows, 1),
        (min(256, hidden), 1, 1),
        (tuple(x.shape),),
        (x.dtype,),
    )


def pair_scores_launch(
    unary: mx.array, hidden: mx.array, pred_rows: mx.array, succ_rows: mx.array
) -> Launch | None:
    """pair_scores(unary [..., g, K], hidden [..., g, R], pred_rows [..., g, P, R],
    succ_rows [..., g, K, R]) on the kernel."""
    arrays = (unary, hidden, pred_rows, succ_rows)
    if any(a.dtype not in FLOAT_DTYPES for a in arrays) or unary.ndim < 2:
        return None
    lead = tuple(unary.shape[:-1])
    k, rank = unary.shape[-1], hidden.shape[-1]
    if tuple(hidden.shape[:-1]) != lead or pred_rows.ndim != unary.ndim + 1:
        return None
    preds = pred_rows.shape[-2]
    if tuple(pred_rows.shape) != (*lead, preds, rank) or tuple(succ_rows.shape) != (*lead, k, rank):
        return None
    if not _fits(*arrays) or math.prod(lead) * preds * k > _MAX_ELEMENTS:
        return None
    rows = math.prod(lead)
    ty = max(1, min(preds, 256 // max(k, 1)))
    return Launch(
        PAIR_SCORES,
        arrays,
        tuple((n, a.dtype) for n, a in zip(PAIR_SCORES.template_names, arrays)),
        (k, preds, rows),
        (min(k, 256), ty, 1),
        ((*lead, preds, k),),
        (mx.float32,),
    )


def walk_supported(lattice: mx.array) -> bool:
    if lattice.ndim < 3 or lattice.dtype != mx.float32 or not _fits(lattice):
        return False
    gamma, preds, k = lattice.shape[-3:]
    return gamma == 1 or preds >= k  # step t > 0 indexes predecessor rows by the previous choice


def walk_launch(
    lattice: mx.array, temperature: float, uniforms: mx.array | None = None
) -> Launch | None:
    """Greedy walk (temperature <= 0) or the sampled walk with the given uniforms [..., g, K]."""
    if not walk_supported(lattice):
        return None
    *lead, gamma, _, k = lattice.shape
    walks = math.prod(lead)
    grid, group = (walks, 1, 1), (min(walks, 64), 1, 1)
    if temperature <= 0:
        return Launch(WALK_GREEDY, (lattice,), (), grid, group, ((*lead, gamma),), (mx.int32,))
    if uniforms is None or tuple(uniforms.shape) != (*lead, gamma, k):
        return None
    return Launch(
        WALK_SAMPLED,
        (lattice, uniforms.astype(mx.float32), mx.array(temperature, dtype=mx.float32)),
        (),
        grid,
        group,
        ((*lead, gamma), (*lead, gamma, k)),
        (mx.int32, mx.float32),
    )


def expected_walk_launch(lattice: mx.array, calibration: float) -> Launch | None:
    """The expected walk at `calibration`: choices [..., g] and values [..., g, P]."""
    if not walk_supported(lattice):
        return None
    *lead, gamma, preds, _ = lattice.shape
    walks = math.prod(lead)
    return Launch(
        WALK_EXPECTED,
        (lattice, mx.array(calibration, dtype=mx.float32)),
        (),
        (walks, 1, 1),
        (min(walks, 64), 1, 1),
        ((*lead, gamma), (*lead, gamma, preds)),
        (mx.int32, mx.float32),
    )
