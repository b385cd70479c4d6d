"""The target's LM head as the drafter uses it: whole, or restricted to a draft vocabulary,
and `TargetBinding`, what a drafter holds of its target (the embedding and the head).

A drafter's LM head is the target's (49k-250k rows), and reading it is most of a draft pass on
bandwidth-bound hardware. `restricted_head` multiplies by the rows of a draft vocabulary only
(FR-Spec style); its logits equal the full head's columns at those ids, for plain, tied and
quantized heads. Verification always uses the full head, so outputs stay exactly the target's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

Head = Callable[[mx.array], mx.array]


@dataclass(frozen=True)
class TargetBinding:
    """The target's frozen embedding and LM head, held by reference (not drafter parameters)."""

    embed: Callable[[mx.array], mx.array]
    head: Callable[[mx.array], mx.array]
    embed_scale: float = 1.0
    # ids [N] -> a head whose logits are head(x)[..., ids], reading only those rows
    restrict: Callable[[mx.array], Callable[[mx.array], mx.array]] | None = None

    def restricted(self, ids: mx.array) -> Callable[[mx.array], mx.array]:
        if self.restrict is not None:
            return self.restrict(ids)
        return lambda x: mx.take(self.head(x), ids, axis=-1)


class TransposedHead:
    """`x @ W.T` with W.T stored contiguous. The two layouts take different OpenBLAS paths for
    the few-row products of decoding: on 49k x 576, the copy ran ~2x faster with the Haswell
    kernels and ~2x slower with the SkylakeX ones, so `cpu_head` times both (equal up to float
    rounding: some kernels differ by 1 ulp between the layouts). `owner`: the module whose
    weight this copies; weights given to it later (`update`, `load_weights`: an adapter swapped
    in) are copied again before use, so the head stays the model's."""

    def __init__(self, weight: mx.array, weight_t: mx.array | None = None, owner=None):
        self.weight, self.owner = weight, owner
        self.weight_t = mx.contiguous(weight.T) if weight_t is None else weight_t
        mx.eval(self.weight_t)

    def __call__(self, x: mx.array) -> mx.array:
        if self.owner is not None and self.owner.weight is not self.weight:
            self.weight = self.owner.weight
            self.weight_t = mx.contiguous(self.weight.T)
        return x @ self.weight_t


# Heads smaller than this are used as stored: a timing would be noise, and the copy buys little.
MIN_TIMED_ELEMENTS = 1 << 22
# The copy must beat the stored layout by this factor to pay for its memory.
MIN_GAIN = 1.1
_PAYS: dict[tuple, bool] = {}  # (shape, dtype) -> whether the copy was faster, per process


def _median_s(fn: Callable[[], mx.array], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _transposed_if_faster(weight: mx.array, rows: int = 4, reps: int = 3) -> mx.array | None:
    """The contiguous W.T when `x @ W.T` on it beats the stored W by MIN_GAIN for `rows` rows
    on this BLAS (timed once per shape and dtype in a process), else None."""
    key = (tuple(weight.shape), weight.dtype)
    if weight.size < MIN_TIMED_ELEMENTS or _PAYS.get(key) is False:
        return None
    weight_t = mx.contiguous(weight.T)
    mx.eval(weight, weight_t)  # a lazy gather (restricted rows) must not be timed
    if key not in _PAYS:
        x = mx.random.normal((rows, weight.shape[1]), key=mx.random.key(0)).astype(weight.dtype)
        stored, copied = (lambda: x @ weight.T), (lambda: x @ weight_t)
        _median_s(stored, 1), _median_s(copied, 1)  # warm up
        _PAYS[key] = _median_s(stored, reps) > MIN_GAIN * _median_s(copied, reps)
    return weight_t if _PAYS[key] else None


class RowsHead:
    """`x @ W.T (+ bias)` over a gathered copy of some rows of a float head."""

    def __init__(self, weight: mx.array, bias: mx.array | None = None):
        self.weight, self.bias = weight, bias
        mx.eval(weight, bias)

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class QuantizedRowsHead:
    """The rows of a quantized head (rows are output features: packing runs along inputs)."""

    def __init__(self, layer, ids: mx.array):
        self.weight = layer["weight"][ids]
        self.scales = layer["scales"][ids]
        biases = layer.get("biases")
        self.biases = None if biases is None else biases[ids]
        self.bias = layer["bias"][ids] if "bias" in layer else None
        self.group_size, self.bits, self.mode = layer.group_size, layer.bits, layer.mode
        mx.eval(self.weight, self.scales, self.biases, self.bias)

    def __call__(self, x: mx.array) -> mx.array:
        y = mx.quantized_matmul(
            x,
            self.weight,
            scales=self.scales,
            biases=self.biases,
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
        )
        return y if self.bias is None else y + self.bias


def _owner(head):
    """The module behind a head: the Linear itself, or the Embedding of a tied `as_linear`."""
    bound = getattr(head, "__self__", None)
    return bound if isinstance(bound, (nn.Embedding, nn.QuantizedEmbedding)) else head


def cpu_head(head: Head) -> Head:
    """A TransposedHead for an unquantized, bias-free head on the CPU where that layout is
    faster on this BLAS (_transposed_if_faster); else `head` itself."""
    if mx.default_device() != mx.cpu:
        return head
    owner = _owner(head)
    if type(owner) in (nn.Linear, nn.Embedding) and "bias" not in owner:
        weight_t = _transposed_if_faster(owner.weight)
        if weight_t is not None:
            return TransposedHead(owner.weight, weight_t, owner)
    return head


def restricted_head(head: Head, ids: mx.array) -> Head:
    """A head whose logits [..., N] are `head(x)[..., ids]`, reading only those rows."""
    owner = head if isinstance(head, TransposedHead) else _owner(head)
    if isinstance(owner, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return QuantizedRowsHead(owner, ids)
    if isinstance(owner, (TransposedHead, nn.Linear, nn.Embedding)):
        rows = owner.weight[ids]
        bias = owner["bias"][ids] if isinstance(owner, nn.Linear) and "bias" in owner else None
        if bias is None and mx.default_device() == mx.cpu:
            rows_t = _transposed_if_faster(rows)
            if rows_t is not None:
                return TransposedHead(rows, rows_t)
        return RowsHead(rows, bias)
    return lambda x: mx.take(head(x), ids, axis=-1)  # unknown head: same logits, no saving
