"""User-facing errors: each says what was wrong, where, and what was expected.

Front ends print `str(err)` without a traceback for any `DFlash2Error`.
"""


class DFlash2Error(Exception):
    """Base class for errors caused by user input (files, configs, parameters)."""


class ConfigError(DFlash2Error):
    """A drafter config.json field is missing, has the wrong type, or is inconsistent."""


class CheckpointError(DFlash2Error):
    """A checkpoint folder, file or tensor is missing, unexpected or misshapen."""


class CompatibilityError(DFlash2Error):
    """A drafter does not fit the target it is paired with."""


class ParameterError(DFlash2Error, ValueError):
    """A generation parameter is out of range or unsupported."""


class ModelNotFoundError(DFlash2Error):
    """An alias is unknown, or a pair is incomplete or cannot be built."""


class FetchError(ModelNotFoundError, CheckpointError):
    """A model folder or Hugging Face repo cannot be found or downloaded (for a drafter, this
    is also why its checkpoint cannot be loaded)."""
