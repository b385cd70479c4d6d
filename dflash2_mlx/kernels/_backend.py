"""Launchers: what runs a launch plan. The dispatch takes any object with this shape, so tests
can run the kernels on the CPU harness (tests/harness) or inject one that fails:

    name: str                                   "metal", "cpu-harness", ...
    unavailable() -> str | None                 why it cannot run here (None: it can)
    device() -> str                             what it runs on, for reports
    __call__(launch, source) -> list[mx.array]  run `launch` with kernel body `source`
"""

from __future__ import annotations

import functools
import platform
import re
import threading
from typing import Callable, Protocol

import mlx.core as mx

from ._launch import Launch
from ._specs import KernelSpec

# Older MLX named a custom kernel's library by its name only, so the variant with an input
# under 8 elements (constant address space) and the one without could collide.
MIN_MLX = (0, 32, 1)


class Launcher(Protocol):
    name: str

    def unavailable(self) -> str | None: ...

    def device(self) -> str: ...

    def __call__(self, launch: Launch, source: str) -> list[mx.array]: ...


def mlx_version() -> str:
    return getattr(mx, "__version__", "?")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def gpu_stream():
    """Where kernels launch: the current default stream when it is a GPU stream (so
    `with mx.stream(...)` is honoured), else the GPU's: never a CPU stream, even under
    mx.set_default_device(mx.cpu)."""
    device = mx.default_device()
    return mx.default_stream(device) if device.type == mx.gpu else mx.Device(mx.gpu)


class MetalLauncher:
    """The real kernels: `mx.fast.metal_kernel` (or `factory`, for tests), built once per
    kernel and source, launched on the GPU stream."""

    name = "metal"

    def __init__(self, factory: Callable | None = None):
        self._factory = factory
        self._kernels: dict[tuple[str, str], Callable] = {}
        self._lock = threading.Lock()

    def unavailable(self) -> str | None:
        try:
            metal = bool(mx.metal.is_available())
        except Exception:  # noqa: BLE001 - an MLX without the metal module
            metal = False
        if not metal:
            system = platform.system()
            where = f" on {system}" if system in ("Linux", "Windows") else ""
            return f"no Metal back-end{where}"
        if not hasattr(mx.fast, "metal_kernel"):
            return f"mlx {mlx_version()} has no mx.fast.metal_kernel"
        if _version_tuple(mlx_version()) < MIN_MLX:
            return (
                f"mlx {mlx_version()} is older than 0.32.1, whose kernel libraries can "
                "collide for small inputs (pip install -U 'mlx>=0.32.1')"
            )
        return None

    def device(self) -> str:
        if self.unavailable() is not None:
            return str(mx.default_device())
        try:  # mx.device_info(device) since mlx 0.30; mx.metal.device_info() before
            found = (
                mx.device_info(mx.Device(mx.gpu))
                if hasattr(mx, "device_info")
                else mx.metal.device_info()
            )
            return f"{found['device_name']} ({found.get('architecture', '?')})"
        except Exception:  # noqa: BLE001 - older names of the fields
            return str(mx.default_device())

    def kernel(self, spec: KernelSpec, source: str) -> Callable:
        """The `mx.fast.metal_kernel` callable for `spec` with body `source`, built once (the
        Metal JIT compiles each template instantiation on first use and MLX caches it)."""
        key = (spec.name, source)
        with self._lock:
            if key not in self._kernels:
                factory = self._factory or mx.fast.metal_kernel
                self._kernels[key] = factory(
                    name=spec.name,
                    input_names=list(spec.input_names),
                    output_names=list(spec.output_names),
                    source=source,
                    header=spec.header,
                )
            return self._kernels[key]

    def __call__(self, launch: Launch, source: str) -> list[mx.array]:
        return self.kernel(launch.spec, source)(**launch.kwargs(), stream=gpu_stream())


@functools.lru_cache(maxsize=1)
def metal_available() -> bool:
    """Metal GPU present and an MLX that builds custom kernels safely (>= 0.32.1)."""
    return MetalLauncher().unavailable() is None
