"""Keeping the weights resident on a GPU with a recommended working set (Apple Silicon), as
mlx-lm's generate and server do: MLX's wired limit set to that size, and a warning where the
weights come close to it (paging slows every step, or Metal runs out of memory)."""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_reduce

CLOSE = 0.9  # of the recommended working set: mlx-lm warns from here too


def weight_bytes(*models) -> int:
    return sum(
        tree_reduce(lambda acc, x: acc + x.nbytes if isinstance(x, mx.array) else acc, m, 0)
        for m in models
    )


def wire_weights(*models) -> str | None:
    """Set the wired limit to the device's recommended working set, where it reports one
    (none on a CPU: nothing is done); a warning where `models`' weights come close to it."""
    from mlx_lm.utils import maybe_set_recommended_wired_limit

    if maybe_set_recommended_wired_limit() is None:
        return None
    limit = mx.device_info()["max_recommended_working_set_size"]
    size = weight_bytes(*models)
    if size <= CLOSE * limit:
        return None
    return (
        f"the weights take {size >> 20:,} MiB, close to this GPU's recommended working set of "
        f"{limit >> 20:,} MiB: generation may be slow (a smaller or quantized target fits)"
    )
