"""Helpers of the kernel tests (test_kernels.py, test_kernel_walks.py). Every kernel-vs-reference
case runs on two executors (conftest.py's `run_kernel` fixture) —
- "harness": the kernel body compiled with the system C++ compiler against tests/harness/
  metal_shim.h, inside the signature MLX would generate, run over the whole grid on the CPU
  (every CI run; skipped only when no C++ compiler exists);
- "metal": the real `mx.fast.metal_kernel` on the GPU (Apple Silicon only; skipped elsewhere,
  and a failure instead of a skip under DFLASH2_KERNELS=on).
Both execute the runtime's own launch plans (dflash2_mlx.kernels._launch).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from dflash2_mlx import kernels


def require_metal():
    if kernels.metal_available():
        return
    if kernels.SETTING.mode is kernels.KernelMode.ON:
        pytest.fail("DFLASH2_KERNELS=on but Metal is unavailable on this machine")
    pytest.skip(
        "Metal unavailable: the real kernels run on Apple Silicon only "
        "(the CPU harness covers the same cases here)"
    )


def f32(a):
    return np.array(a.astype(mx.float32))


def lattice(lead, gamma, k, seed, scale=3.0):
    return scale * mx.random.normal((*lead, gamma, k, k), key=mx.random.key(seed))
