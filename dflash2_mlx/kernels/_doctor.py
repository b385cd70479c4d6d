"""`check_kernels`: every kernel against its reference on this machine, for `dflash2 doctor
--kernels` and bug reports."""

from __future__ import annotations

import platform

from . import _checks
from ._backend import mlx_version
from ._dispatch import current
from ._settings import ENV_VAR
from ._specs import SPECS


def check_kernels() -> dict:
    """Run each kernel's self-check for each dtype it supports with the current launcher
    (the Metal GPU), whatever DFLASH2_KERNELS says; the process's own kernel state is left
    alone.

    Returns {"ran", "reason", "mlx", "device", "platform", "launcher", "setting", "ok",
    "rows": [{"kernel", "dtype", "shape", "max_abs_err", "tolerance", "status", "error"}]}:
    `ran` False with the reason where the launcher cannot run here (no rows), `ok` whether
    every row passed."""
    d = current()
    reason = d.unavailable()
    rows = []
    if reason is None:
        for name, spec in SPECS.items():
            for dtypes in _checks.DOCTOR_DTYPES[name]:
                rows.append(_checks.run(_checks.case(spec, dtypes), d.execute).to_dict())
    return {
        "ran": reason is None,
        "reason": reason or "",
        "mlx": mlx_version(),
        "device": d.launcher.device(),
        "platform": platform.platform(terse=True),
        "launcher": d.launcher.name,
        "setting": f"{ENV_VAR}={d.setting.mode.value}",
        "ok": reason is None and all(r["status"] == "ok" for r in rows),
        "rows": rows,
    }
