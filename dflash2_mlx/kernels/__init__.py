"""Custom Metal kernels for DFlash2's hot small ops, with pure-MLX fallbacks.

- `dynamic_conv`: the fused two-tap grouped dynamic convolution (prepare and finish).
- `pair_scores`: the selector's K x K pair scores per drafted row.
- `walk`: the selector's stepwise greedy walk and sampled walk (`walk_with_uniforms` takes
  the noise).
- `expected_walk_choices`: the path with the most accepted drafts expected, one kernel launch
  per round (the reference is a few small ops per drafted row); greedy drafts take it, and the
  stepwise walk only when the selector's `walk_calibration` is None.

Each op dispatches to its kernel (metal/*.metal bodies, built once with
`mx.fast.metal_kernel`) when Metal is available, `DFLASH2_KERNELS` is not `off`, the
shape/dtype is supported and the kernel passed its self-check against the reference (once per
process and dtype; under `auto` a failure falls back with one `KernelFallbackWarning`, under
`on` it raises); otherwise to the pure-MLX reference (`_references`).
`status()` / `describe()` report the active path; `check_kernels()` runs every kernel against
its reference (`dflash2 doctor --kernels`); `bench_kernels()` times kernels vs references.
"""

from ._backend import Launcher, MetalLauncher, metal_available
from ._bench import bench_kernels
from ._checks import CheckResult
from ._dispatch import (
    Dispatcher,
    KernelCheckError,
    KernelFallbackWarning,
    current,
    describe,
    execute,
    kernels_active,
    override,
    status,
)
from ._doctor import check_kernels
from ._ops import dynamic_conv, expected_walk_choices, pair_scores, walk, walk_with_uniforms
from ._settings import ENV_VAR, SETTING, KernelMode, KernelSetting
from ._specs import SPECS, KernelSpec, kernel_source

__all__ = [
    "bench_kernels",
    "check_kernels",
    "describe",
    "dynamic_conv",
    "execute",
    "expected_walk_choices",
    "kernels_active",
    "metal_available",
    "override",
    "current",
    "pair_scores",
    "status",
    "walk",
    "walk_with_uniforms",
    "CheckResult",
    "Dispatcher",
    "KernelCheckError",
    "KernelFallbackWarning",
    "Launcher",
    "MetalLauncher",
    "ENV_VAR",
    "SETTING",
    "KernelMode",
    "KernelSetting",
    "SPECS",
    "KernelSpec",
    "kernel_source",
]
