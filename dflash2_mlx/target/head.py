"""The target's LM head as the drafter uses it: whole, or restricted to a draft vocabulary,
and `TargetBinding`, what a drafter holds of its target (the embedding and the head).

A drafter's LM head is the target's (49k-250k rows), and reading it is most of a draft pass on
bandwidth-bound hardware. `restricted_head` multiplies by the rows of a draft vocabulary only
(FR-Spec style); its logits equal the full head's columns at those ids, for plain, tied and
quantized heads. Verification always uses the full head, so outputs stay exactly the target's.
"""

from __future__ import annotations

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
    """`x @ W.T` with W.T stored contiguous. On the CPU, OpenBLAS runs the few-row products of
    decoding about 2x faster on a pre-transposed head (measured on 49k x 576; equal up to float
    rounding: some OpenBLAS kernels differ by 1 ulp between the layouts); it costs one copy of
    the head, so it is used on the CPU only."""

    def __init__(self, weight: mx.array):
        self.weight = weight
        self.weight_t = mx.contiguous(weight.T)
        mx.eval(self.weight_t)

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self.weight_t


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
    """A TransposedHead for an unquantized, bias-free head on the CPU; else `head` itself."""
    if mx.default_device() != mx.cpu:
        return head
    owner = _owner(head)
    if type(owner) in (nn.Linear, nn.Embedding) and "bias" not in owner:
        return TransposedHead(owner.weight)
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
            return TransposedHead(rows)
        return RowsHead(rows, bias)
    return lambda x: mx.take(head(x), ids, axis=-1)  # unknown head: same logits, no saving
