"""dflash2: DFlash / DFlash2 block-diffusion speculative decoding on MLX.

Importing this package binds an optimized BLAS on Linux before MLX loads (see _blas.py); every
module of the package imports MLX only after this has run. The public names below load on
first use (PEP 562), so `import dflash2_mlx` and the constants the CLI reads stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import _blas
from ._version import __version__ as __version__

_blas.bind()

_EXPORTS = {  # public name -> the module that defines it
    "Pair": "api",
    "doctor": "diagnostics",
    "load_pair": "loader",
    "BatchDecoder": "engine.batch",
    "load_drafter": "checkpoint",
    "save_drafter": "checkpoint",
    "DrafterConfig": "config",
    "GenerationStats": "engine.events",
    "RoundEvent": "engine.events",
    "GenerationParams": "engine.generation",
    "TokenLogprob": "engine.logprobs",
    "Session": "engine.session",
    "SpeculativeDecoder": "engine.loop",
    "PromptCache": "engine.prompt_cache",
    "penalties": "engine.processors",
    "SamplingParams": "sampling",
    "generate_text": "text",
    "stream_text": "text",
    "CheckpointError": "errors",
    "CompatibilityError": "errors",
    "ConfigError": "errors",
    "DFlash2Error": "errors",
    "FetchError": "errors",
    "ModelNotFoundError": "errors",
    "ParameterError": "errors",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and editors see: the names __getattr__ loads
    from .api import Pair as Pair
    from .loader import load_pair as load_pair
    from .diagnostics import doctor as doctor
    from .checkpoint import load_drafter as load_drafter, save_drafter as save_drafter
    from .config import DrafterConfig as DrafterConfig
    from .engine.batch import BatchDecoder as BatchDecoder
    from .engine.events import GenerationStats as GenerationStats, RoundEvent as RoundEvent
    from .engine.generation import GenerationParams as GenerationParams
    from .engine.logprobs import TokenLogprob as TokenLogprob
    from .engine.loop import SpeculativeDecoder as SpeculativeDecoder
    from .engine.processors import penalties as penalties
    from .engine.prompt_cache import PromptCache as PromptCache
    from .engine.session import Session as Session
    from .errors import (
        CheckpointError as CheckpointError,
        CompatibilityError as CompatibilityError,
        ConfigError as ConfigError,
        DFlash2Error as DFlash2Error,
        FetchError as FetchError,
        ModelNotFoundError as ModelNotFoundError,
        ParameterError as ParameterError,
    )
    from .sampling import SamplingParams as SamplingParams
    from .text import generate_text as generate_text, stream_text as stream_text


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
