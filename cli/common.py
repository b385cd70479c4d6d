"""Helpers shared by the commands. Nothing here imports MLX or model code."""

from __future__ import annotations

import sys

import typer

EXIT_USAGE = 2  # every user mistake: bad option value, unknown model, bad checkpoint ...


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def fail(message: str) -> None:
    raise UserError(message)


def is_user_error(exc: BaseException) -> bool:
    """UserError, or a dflash2_mlx DFlash2Error (checked without importing the library)."""
    if isinstance(exc, UserError):
        return True
    errors = sys.modules.get("dflash2_mlx.errors")
    return errors is not None and isinstance(exc, errors.DFlash2Error)


def print_error(message: str) -> None:
    message = " ".join(str(message).split())  # one line, whatever the exception held
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)



def raised_in(exc: BaseException, package: str) -> bool:
    """Whether `exc` came through `package` (e.g. mlx-lm rejecting a model folder, possibly via
    transformers or safetensors: the user's mistake, not a bug of ours)."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", "")
        if name == package or name.startswith(package + "."):
            return True
        tb = tb.tb_next
    return False
