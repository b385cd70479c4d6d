"""Where a speculative greedy output parts from plain decoding's: whether the target's logits
of the two tokens there lie within float rounding of each other (a near-tie, which a verify's
and a one-token forward's matmul shapes may split either way: in bf16 on a GPU they round
apart by units in the last place) or apart (a real difference: a bug)."""

from __future__ import annotations

import math
from typing import Sequence

import mlx.core as mx

_MANTISSA = {mx.float32: 23, mx.bfloat16: 7, mx.float16: 10}
FLOOR = 1e-4  # fp32's logits differ by ~2e-5 between shapes with OpenBLAS's AVX2 kernels


def rounding(value: float, dtype) -> float:
    """The tolerance a logit of `value` in `dtype` carries: 4 units in the last place (the
    forward's rounding accumulates over its layers), FLOOR at least."""
    exponent = math.frexp(max(abs(value), 1.0))[1] - 1
    return max(4.0 * 2.0 ** (exponent - _MANTISSA.get(dtype, 23)), FLOOR)


def divergence(model, ids: Sequence[int], agreed: Sequence[int], plain: int, other: int) -> dict:
    """The target's logits of `plain` and `other` after `ids` + `agreed` (one forward):
    {"gap", "tolerance", "near_tie"}."""
    logits = model(mx.array([*ids, *agreed])[None])[0, -1]
    dtype = logits.dtype
    logits = logits.astype(mx.float32)
    gap = abs(float(logits[plain].item()) - float(logits[other].item()))
    tolerance = rounding(float(mx.max(mx.abs(logits)).item()), dtype)
    return {"gap": gap, "tolerance": tolerance, "near_tie": gap <= tolerance}


def parting(model, ids: Sequence[int], reference: Sequence[int], other: Sequence[int], m: int):
    """`divergence` where two outputs of `ids` part at token m (a length difference, where one
    ended, is no tie)."""
    if m >= len(reference) or m >= len(other):
        return {"near_tie": False}
    return divergence(model, ids, reference[:m], reference[m], other[m])
