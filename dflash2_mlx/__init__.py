"""dflash2: DFlash / DFlash2 block-diffusion speculative decoding on MLX.

Importing this package binds an optimized BLAS on Linux before MLX loads (see _blas.py).
"""

from . import _blas

_blas.bind()

__version__ = "0.1.0"

from .api import Pair, doctor, load_pair  # noqa: E402
from .checkpoint import load_drafter, save_drafter  # noqa: E402
from .config import DrafterConfig  # noqa: E402
from .engine.batch import BatchDecoder  # noqa: E402
from .engine.events import GenerationStats, RoundEvent  # noqa: E402
from .engine.loop import GenerationParams, Session, SpeculativeDecoder  # noqa: E402
from .engine.prompt_cache import PromptCache  # noqa: E402
from .engine.sampling import SamplingParams  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError, CompatibilityError, ConfigError, DFlash2Error, ParameterError,
)

__all__ = [
    "Pair", "BatchDecoder", "doctor", "load_pair", "load_drafter", "save_drafter", "DrafterConfig",
    "GenerationStats", "RoundEvent", "GenerationParams", "Session", "SpeculativeDecoder",
    "PromptCache", "SamplingParams", "CheckpointError", "CompatibilityError", "ConfigError", "DFlash2Error",
    "ParameterError",
]
