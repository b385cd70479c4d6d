"""`dflash2`: parse and dispatch only. Model code is imported inside commands, never at import."""

from __future__ import annotations

import json

import typer

app = typer.Typer(
    name="dflash2",
    help="Lossless DFlash 2 speculative decoding for local LLMs on MLX.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool):
    if value:
        from importlib.metadata import version

        typer.echo(f"dflash2 {version('dflash2')}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
):
    """Lossless DFlash 2 speculative decoding for local LLMs on MLX."""


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Report backend, device, BLAS in use and versions.

    Example: dflash2 doctor --json
    """
    import dflash2_mlx

    info = dflash2_mlx.doctor()
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    for k, v in info.items():
        typer.echo(f"{k:>14}: {v}")


def main():
    app()


if __name__ == "__main__":
    main()
