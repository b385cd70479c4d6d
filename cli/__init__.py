"""The `dflash2` command line (installed as the `dflash2_cli` package)."""

import warnings


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the command's user reads it: one line, no source file or code."""
    return f"warning: {' '.join(str(message).split())}\n"


# Set before the commands import the library, whose BLAS binding may warn at import.
warnings.formatwarning = _one_line_warning
