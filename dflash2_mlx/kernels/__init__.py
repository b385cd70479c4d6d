"""Custom Metal kernels for DFlash2's hot small ops, with pure-MLX fallbacks.

- `dynamic_conv`: the fused two-tap grouped dynamic convolution (prepare and finish).
- `pair_scores`: the selector's K x K pair scores per drafted row.
- `walk`: the selector's greedy walk and sampled walk (`walk_with_uniforms` takes the noise).

Each op dispatches to its kernel (metal/*.metal bodies, built once with
`mx.fast.metal_kernel`) when Metal is available, `DFLASH2_KERNELS` is not `off` and the
shape/dtype is supported; otherwise to the pure-MLX reference in dflash2_mlx.drafter.
`status()` / `describe()` report the active path; `bench_kernels()` times kernels vs references.
"""

from ._bench import bench_kernels
from ._dispatch import (
    describe, dynamic_conv, execute, kernels_active, metal_available, pair_scores, status, walk,
    walk_with_uniforms,
)
from ._settings import ENV_VAR, SETTING, KernelMode, KernelSetting
from ._specs import SPECS, KernelSpec, kernel_source

__all__ = [
    "bench_kernels", "describe", "dynamic_conv", "execute", "kernels_active", "metal_available",
    "pair_scores", "status", "walk", "walk_with_uniforms", "ENV_VAR",
    "SETTING", "KernelMode", "KernelSetting", "SPECS", "KernelSpec", "kernel_source",
]
