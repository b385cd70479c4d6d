"""`dflash2`: parse and dispatch only. Model code is imported inside commands, never at import.

Commands live in their own modules (chat.py, models.py) and are added with `register(app)`.
`main()` turns every user mistake (a usage error, a `DFlash2Error`) into one line on stderr and
exit code 2, without a traceback.
"""

from __future__ import annotations

import json
import os
import sys

import typer

try:  # typer >= 0.22 vendors click; older typers use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions

from . import bench, chat, corpus, evaluate, models, serve, train
from .common import EXIT_USAGE, is_user_error, print_error
from .foreign_flags import foreign_flag_hint
from .helptext import TidyGroup
from .terminal import locale_streams

app = typer.Typer(
    name="dflash2",
    help="Lossless DFlash 2 speculative decoding for local LLMs on MLX.\n\n"
    "Example: dflash2 chat qwen3-4b",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's layout: option help gets the rest of the line (helptext.py)
    cls=TidyGroup,
)


def _version(value: bool):
    if value:
        from importlib.metadata import version

        typer.echo(f"dflash2 {version('dflash2')}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
):
    """Lossless DFlash 2 speculative decoding for local LLMs on MLX.

    Example: dflash2 chat qwen3-4b
    """


@app.command()
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    kernels: bool = typer.Option(
        False,
        "--kernels",
        help="Run every custom Metal kernel against its pure-MLX reference on this machine and "
        "print a table to paste into a bug report (exit 1 if one fails).",
    ),
):
    """Report backend, device, BLAS in use and versions; --kernels checks the Metal kernels.

    Example: dflash2 doctor --json
    """
    if kernels:
        from dflash2_mlx.kernels import check_kernels

        report = check_kernels()
        typer.echo(json.dumps(report, indent=2) if as_json else _kernel_table(report))
        raise typer.Exit(0 if report["ok"] or not report["ran"] else 1)
    import dflash2_mlx

    info = dflash2_mlx.doctor()
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    width = max(map(len, info))
    for k, v in info.items():
        if v not in ("", None):  # e.g. no BLAS note on this machine
            typer.echo(f"{k:>{width}}: {v}")


def _kernel_table(report: dict) -> str:
    """`doctor --kernels` as Markdown: the machine, then one row per kernel and dtype."""
    where = f"mlx {report['mlx']} · {report['platform']} · {report['device']} · {report['setting']}"
    if not report["ran"]:
        return (
            f"Custom kernels not run: {report['reason']} ({where}).\n"
            "The pure-MLX references are used on this machine."
        )

    def num(v):
        return "-" if v is None else f"{v:.3g}"

    lines = [
        f"dflash2 kernels vs references ({where})",
        "",
        "| kernel | dtype | shape | max abs err | tolerance | status |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['kernel']} | {r['dtype']} | {r['shape']} | {num(r['max_abs_err'])} | "
        f"{num(r['tolerance'])} | {r['status']} |"
        for r in report["rows"]
    ]
    lines += [f"\n{r['kernel']} {r['dtype']}: {r['error']}" for r in report["rows"] if r["error"]]
    return "\n".join(lines)


models.register(app)
chat.register(app)
serve.register(app)
train.register(app)
corpus.register(app)
bench.register(app)
evaluate.register(app)


_NO_ARGS = getattr(click_exceptions, "NoArgsIsHelpError", ())


def _command_path(argv: list[str] | None) -> str:
    """'dflash2 chat' when argv names a subcommand (a usage error raised before click made
    its context, as a flag missing its value, has none)."""
    first = next((a for a in (sys.argv[1:] if argv is None else argv) if a[:1] != "-"), None)
    return f"dflash2 {first}" if first in typer.main.get_command(app).commands else "dflash2"


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` (default: sys.argv[1:]) and return the exit code."""
    locale_streams()
    try:
        rv = app(args=argv, prog_name="dflash2", standalone_mode=False)
    except _NO_ARGS as exc:  # bare `dflash2`: the help, not an error
        typer.echo(exc.format_message())
        return 0
    except click_exceptions.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else _command_path(argv)
        foreign = isinstance(exc, click_exceptions.NoSuchOption) and foreign_flag_hint(
            exc.option_name
        )
        print_error(f"{foreign or exc.format_message()} (see '{where} --help')")
        return EXIT_USAGE
    except typer.Abort as exc:
        if isinstance(exc.__context__, EOFError):  # click's Abort for an EOFError: not a Ctrl-C
            print_error(f"unexpected end of data: {str(exc.__context__) or 'EOFError'}")
            return 1
        return 130
    except PermissionError as exc:  # a folder or file the user may not open: one line
        if not exc.filename:  # nothing to name: where it came from is the traceback's to say
            raise
        print_error(f"{exc.filename}: {exc.strerror}")
        return EXIT_USAGE
    except BrokenPipeError:  # `dflash2 ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # noqa: BLE001 - user errors only; everything else re-raises
        if not is_user_error(exc):
            raise
        print_error(str(exc))
        return EXIT_USAGE
    return rv if isinstance(rv, int) else 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
