"""Dispatch: whether a call takes its custom kernel or its pure-MLX reference.

A kernel runs where `DFLASH2_KERNELS` is not `off`, the launcher can run here (Metal), the
shape/dtype is supported, and the kernel passed its self-check for those input dtypes: once
per process, on first use, a small input against the reference (`_checks`). Under `auto` a
compile error, launch error or mismatch turns that kernel off for the rest of the process with
one `KernelFallbackWarning`; under `on` it raises `KernelCheckError` (every call).

The state lives in a `Dispatcher`; `override()` swaps in another one (another launcher, setting
or kernel sources, a fresh self-check state) for a block: tests, `doctor --kernels`.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Callable

import mlx.core as mx

from . import _checks, _launch
from ._backend import Launcher, MetalLauncher, metal_available
from ._launch import Launch
from ._settings import ENV_VAR, SETTING, KernelMode, KernelSetting
from ._specs import KernelSpec, kernel_source, source_location


class KernelFallbackWarning(RuntimeWarning):
    """A custom kernel failed its self-check; its pure-MLX reference is used instead."""


class KernelCheckError(RuntimeError):
    """DFLASH2_KERNELS=on and a custom kernel failed its self-check."""


def shipped_source(spec: KernelSpec) -> str:
    return kernel_source(spec.file)


class Dispatcher:
    def __init__(
        self,
        setting: KernelSetting = SETTING,
        launcher: Launcher | None = None,
        source: Callable[[KernelSpec], str] = shipped_source,
    ):
        self.setting = setting
        self.launcher = launcher if launcher is not None else MetalLauncher()
        self.source = source
        self._unavailable: list[str | None] = []  # filled on first ask
        self._passed: set[tuple[str, tuple]] = set()
        self._failed: dict[str, _checks.CheckResult] = {}
        self._lock = threading.Lock()

    def unavailable(self) -> str | None:
        """Why the launcher cannot run here (None: it can), asked once."""
        if not self._unavailable:
            self._unavailable.append(self.launcher.unavailable())
        return self._unavailable[0]

    def active(self, setting: KernelSetting | None = None) -> bool:
        setting = self.setting if setting is None else setting
        return setting.mode is not KernelMode.OFF and self.unavailable() is None

    def execute(self, launch: Launch) -> list[mx.array]:
        return self.launcher(launch, self.source(launch.spec))

    def failures(self) -> dict[str, _checks.CheckResult]:
        """Kernels turned off by a failed self-check, by kernel name."""
        return dict(self._failed)

    def use_kernel(self, launch: Launch | None) -> bool:
        """Whether this call runs its kernel (runs the self-check on a kernel's first use
        with these input dtypes and template values: the instantiation the call runs)."""
        if launch is None or not self.active() or not _launch.device_buffers_only(launch):
            return False
        name, key = launch.spec.name, (launch.input_dtypes, launch.template_values)
        if (name, key) in self._passed:
            return True
        first_failure = False
        with self._lock:  # one check per instantiation, even with several threads
            if name not in self._failed and (name, key) not in self._passed:
                check = _checks.case(launch.spec, *key)
                result = _checks.run(check, self.execute)
                if result.ok:
                    self._passed.add((name, key))
                else:
                    self._failed[name] = result
                    first_failure = True
        failure = self._failed.get(name)
        if failure is None:
            return True
        if self.setting.mode is KernelMode.ON:
            raise KernelCheckError(f"custom kernel {failure.describe()} ({ENV_VAR}=on)")
        if first_failure:
            warnings.warn(
                f"dflash2: custom kernel {failure.describe()}; using its pure-MLX reference "
                f"for the rest of this process ({ENV_VAR}=off skips the kernels, "
                f"{ENV_VAR}=on makes this an error)",
                KernelFallbackWarning,
                stacklevel=3,
            )
        return False


_current = Dispatcher()


def current() -> Dispatcher:
    return _current


@contextlib.contextmanager
def override(
    *,
    launcher: Launcher | None = None,
    setting: KernelSetting | None = None,
    source: Callable[[KernelSpec], str] | None = None,
):
    """A block with another launcher / setting / kernel sources and a fresh self-check state;
    the previous dispatcher (and what it learned) is back afterwards."""
    global _current
    saved = _current
    _current = Dispatcher(
        saved.setting if setting is None else setting,
        saved.launcher if launcher is None else launcher,
        saved.source if source is None else source,
    )
    try:
        yield _current
    finally:
        _current = saved


def execute(launch: Launch) -> list[mx.array]:
    """Run a launch plan with the current launcher (the Metal GPU unless overridden)."""
    return _current.execute(launch)


def kernels_active(setting: KernelSetting | None = None) -> bool:
    """Whether supported calls go to the custom kernels under `setting` (default: the
    current one), before self-checks."""
    return _current.active(setting)


OPS = ("dynamic_conv", "pair_scores", "walk_greedy", "walk_sampled", "walk_expected")


def status(setting: KernelSetting | None = None) -> dict:
    """Which path the ops take, and why."""
    d = _current
    setting = d.setting if setting is None else setting
    unavailable = d.unavailable()
    failed = {_checks.label(name): r.describe() for name, r in d.failures().items()}
    if setting.mode is KernelMode.OFF:
        reason = f"forced by {ENV_VAR}=off"
    elif unavailable is not None:
        reason = unavailable + (
            f" ({ENV_VAR}=on was asked)" if setting.mode is KernelMode.ON else ""
        )
    else:
        reason = (
            "Metal available; each kernel checks itself on first use per dtype, "
            "unsupported shapes/dtypes fall back per call"
        )
        if failed:
            reason += "; failed their self-check (reference used): " + ", ".join(failed)
    return {
        "path": "metal" if d.active(setting) else "reference",
        "reason": reason,
        "setting": setting.mode.value,
        "setting_note": setting.note,
        "metal": metal_available(),
        "launcher": d.launcher.name,
        "failed": failed,
        "ops": list(OPS),
        "sources": source_location(),
    }


def describe(setting: KernelSetting | None = None) -> str:
    """One line for `dflash2 doctor`."""
    s = status(setting)
    line = f"{s['path']} ({s['reason']}; {ENV_VAR}={s['setting']})"
    return line + (f" [{s['setting_note']}]" if s["setting_note"] else "")
