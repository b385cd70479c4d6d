"""`DFLASH2_KERNELS`, resolved once at import into a small typed setting.

DFLASH2_KERNELS=auto (default)  custom Metal kernels where Metal is available and the
                                shape/dtype is supported, the pure-MLX references elsewhere
DFLASH2_KERNELS=on              the same dispatch, but kernels are asked for: the Metal-only
                                tests fail (instead of skipping) when Metal is unavailable
DFLASH2_KERNELS=off             always the pure-MLX references
"""

from __future__ import annotations

import enum
import os
import warnings
from dataclasses import dataclass

ENV_VAR = "DFLASH2_KERNELS"


class KernelMode(enum.Enum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


_ALIASES = {
    "": KernelMode.AUTO,
    "auto": KernelMode.AUTO,
    "default": KernelMode.AUTO,
    "on": KernelMode.ON,
    "1": KernelMode.ON,
    "true": KernelMode.ON,
    "yes": KernelMode.ON,
    "metal": KernelMode.ON,
    "off": KernelMode.OFF,
    "0": KernelMode.OFF,
    "false": KernelMode.OFF,
    "no": KernelMode.OFF,
    "reference": KernelMode.OFF,
}


@dataclass(frozen=True)
class KernelSetting:
    mode: KernelMode
    raw: str | None  # the variable as found (None: unset)
    note: str = ""  # set when the value was not understood

    def __str__(self) -> str:
        return f"{ENV_VAR}={self.mode.value}"


def resolve(raw: str | None) -> KernelSetting:
    """Parse a `DFLASH2_KERNELS` value (None: unset). Unknown values mean `auto`, with a note."""
    if raw is None:
        return KernelSetting(KernelMode.AUTO, None)
    mode = _ALIASES.get(raw.strip().lower())
    if mode is None:
        return KernelSetting(
            KernelMode.AUTO, raw, f"{ENV_VAR}={raw!r} not understood (auto, on, off): using auto"
        )
    return KernelSetting(mode, raw)


SETTING: KernelSetting = resolve(os.environ.get(ENV_VAR))
if SETTING.note:
    warnings.warn(SETTING.note, stacklevel=2)
