"""DFlash2's grouped dynamic causal convolution over block positions, as a drafter layer.

coefficient[t, k, c] = base[side, k, c] + dynamic[t, side, k, c // g], where `dynamic` is a
linear projection of the sublayer's normed input row t. Taps read rows t-k of the same block
and never cross the block start (rows before 0 are zero). The op itself is
`kernels.dynamic_conv` (a Metal kernel, or the reference in kernels/_references.py).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .. import kernels


class GroupedDynamicConv(nn.Module):
    """One conv pair around a sublayer: `prepare` before it, `finish` after it."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.group_size = group_size
        groups = hidden_size // group_size
        # Identity init: tap 0 = 1, other taps 0, no dynamic part.
        base = mx.zeros((2, kernel_size, hidden_size))
        base[:, 0, :] = 1.0
        self.base_kernel = base
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * groups, bias=False)
        self.kernel_projection.weight = mx.zeros_like(self.kernel_projection.weight)

    def coefficients(self, u: mx.array) -> mx.array:
        """[..., L, H] -> [..., L, 2, T, G] (row-major over (side, tap, group))."""
        groups = u.shape[-1] // self.group_size
        return self.kernel_projection(u).reshape(*u.shape[:-1], 2, self.kernel_size, groups)

    def prepare(self, u: mx.array) -> tuple[mx.array, mx.array]:
        dyn = self.coefficients(u)
        out = kernels.dynamic_conv(u, dyn[..., 0, :, :], self.base_kernel[0], self.group_size)
        return out, dyn

    def finish(self, y: mx.array, dyn: mx.array) -> mx.array:
        return kernels.dynamic_conv(y, dyn[..., 1, :, :], self.base_kernel[1], self.group_size)
