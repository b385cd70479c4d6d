"""dflash2: DFlash / DFlash2 block-diffusion speculative decoding on MLX.

Importing this package binds an optimized BLAS on Linux before MLX loads (see _blas.py); every
module of the package imports MLX only after this has run. The public names below load on
first use (PEP 562), so `import dflash2_mlx` and the constants the CLI reads stay light.
"""

from __future__ import annotations

import importlib

from . import _blas

_blas.bind()

__version__ = "0.1.0"

_EXPORTS = {  # public name -> the module that defines it
    "Pair": "api",
    "doctor": "api",
    "load_pair": "api",
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


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
