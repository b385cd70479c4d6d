"""`dflash2 evaluate`: a drafter's acceptance length τ on held-out prompts, per category."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from .common import (
    output_path,
    DraftVocabOpt,
    DrafterOpt,
    FullVocabOpt,
    LookupOpt,
    NoDatastoreOpt,
    ModelArg,
    OfflineOpt,
    TargetOpt,
    check_writable,
    engine_flags,
    fail,
    number_list,
    given_params,
)
from .loading import load_resolved
from .terminal import text_row


def evaluate(
    ctx: typer.Context,
    model: ModelArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    prompts: str = typer.Option("heldout", help="Bundled split name or a JSONL file."),
    limit: Optional[int] = typer.Option(
        None, min=1, help="At most N prompts, spread over the categories."
    ),
    max_tokens: int = typer.Option(128, min=1, help="Tokens generated per prompt."),
    blocks: Optional[str] = typer.Option(
        None,
        help="Block sizes, e.g. 4,8, each at most the drafter's trained size [default: 4, 8 "
        "and 16 below the trained size, and that size].",
        show_default=False,
    ),
    temperatures: str = typer.Option("0,1", help="Sampling temperatures, e.g. 0,0.7."),
    seed: int = typer.Option(0, min=0, max=2**64 - 1, help="Sampling seed (temperatures above 0)."),
    top_p: Optional[float] = typer.Option(None, help="top_p of the sampled runs (default: off)."),
    top_k: Optional[int] = typer.Option(None, help="top_k of the sampled runs (default: off)."),
    min_p: Optional[float] = typer.Option(None, help="min_p of the sampled runs (default: off)."),
    json_path: Optional[Path] = typer.Option(
        None, "--json", help="Write the results here.", callback=output_path("--json")
    ),
    offline: OfflineOpt = False,
    full_vocab: FullVocabOpt = False,
    draft_vocab: DraftVocabOpt = None,
    lookup: LookupOpt = None,
    no_datastore: NoDatastoreOpt = False,
):
    """Measure τ (mean tokens committed per round, bonus included) per temperature, block
    size and prompt category, with the real engine.

    Example: dflash2 evaluate --limit 14 --blocks 4,8 --json results/tau.json
    """
    given_blocks, temps = _parse_lists(blocks, temperatures)
    from dflash2_mlx.settings import check_sampling  # the given ones, checked as chat's flags

    filters = check_sampling({"top_p": top_p, "top_k": top_k, "min_p": min_p})
    for name in ("seed", *filters) if not any(t > 0 for t in temps) else ():
        if name in given_params(ctx):
            flag = "--" + name.replace("_", "-")
            fail(f"{flag} only applies to sampled runs: every --temperatures value is 0")
    check_writable(json_path, "--json", {"--prompts": prompts})  # before the run, not after
    from rich.console import Console
    from rich.text import Text

    from dflash2_mlx.bench import select_prompts
    from dflash2_mlx.paths import write_whole
    from dflash2_mlx.prompts import load_prompts
    from dflash2_mlx.train.evaluate import measure_tau

    chosen = select_prompts(load_prompts(prompts), limit)  # a bad file: before any model
    err = Console(stderr=True)
    pair, resolved, _ = load_resolved(
        model,
        target,
        drafter,
        offline,
        lambda m: err.print(m, style="dim"),
        engine_flags(
            lookup=lookup,
            datastore=not no_datastore,
            full_vocab=full_vocab,
            draft_vocab=draft_vocab,
        ),
    )
    block_list = _check_trained(given_blocks, pair.drafter.config.block_size)
    with _progress(err) as on_run:
        result = measure_tau(
            pair,
            chosen,
            block_sizes=block_list,
            temperatures=temps,
            max_tokens=max_tokens,
            seed=seed,
            progress=on_run,
            filters=filters,
        )
    Console().print(_tau_table(result, f"τ on {len(chosen)} '{prompts}' prompts"))
    if json_path:  # check_writable found its folder writable
        record = {"prompts": prompts, "prompt_ids": [p.id for p in chosen]}
        record.update(max_tokens=max_tokens, seed=seed, filters=filters, results=result)
        try:  # whole or not at all: a full disk leaves the file that was there
            write_whole(json_path, json.dumps(_report(pair, resolved, record), indent=2))
        except OSError as exc:
            fail(f"cannot write {json_path}: {exc.strerror or exc}")
        Console().print(Text(f"results: {json_path}", style="dim"))  # as bench says it


@contextmanager
def _progress(console):
    """A bar on a terminal (generations done of all), a line at each quarter elsewhere."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    bar = Progress(
        "evaluating", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    )
    task = bar.add_task("evaluate", total=None)

    def on_run(done: int, total: int) -> None:
        if console.is_terminal:
            bar.update(task, completed=done, total=total)
        elif done * 4 // total != (done - 1) * 4 // total:
            console.print(f"evaluated {done}/{total} generations", style="dim")

    if not console.is_terminal:
        yield on_run
        return
    with bar:
        yield on_run


def _parse_lists(
    blocks: str | None, temperatures: str
) -> tuple[tuple[int, ...] | None, tuple[float, ...]]:
    """'4,8' and '0,1' -> (4, 8), (0.0, 1.0), checked before any model loads, as chat's and
    bench's --block and --temp; no --blocks: None (the default needs the trained size)."""
    from dflash2_mlx.settings import check_block, check_sampling

    block_list = None
    if blocks is not None:
        block_list = tuple(
            dict.fromkeys(  # a setting given twice is measured once
                check_block(b, flag="--blocks") for b in number_list(blocks, int, "--blocks", "4,8")
            )
        )
    temps = tuple(dict.fromkeys(number_list(temperatures, float, "--temperatures", "0,0.7")))
    for t in temps:
        check_sampling({"temperature": t}, {"temperature": "--temperatures"})
    return block_list, temps


def _check_trained(given: tuple[int, ...] | None, trained: int) -> tuple[int, ...] | None:
    """`given`, each at most the drafter's trained block size, refused (naming --blocks) as
    chat's and bench's --block: a skipped block would leave a hole in the results."""
    from dflash2_mlx.settings import check_block

    return None if given is None else tuple(check_block(b, trained, "--blocks") for b in given)


def _tau_table(result: dict, title: str):
    """One row per setting: τ overall and per prompt category."""
    from rich.table import Table

    cats = sorted({c for r in result.values() for c in r["per_category"]})
    table = Table("setting", "τ", *cats, title=title)
    for name, r in result.items():
        text_row(
            table, name, f"{r['tau']:.3f}", *(f"{r['per_category'].get(c, 0):.2f}" for c in cats)
        )
    return table


def _report(pair, resolved, record: dict) -> dict:
    """The JSON written by --json: the command, machine and pair, then `record`."""
    from dflash2_mlx.bench_env import pair_record, report_header

    named = pair_record(pair, resolved)
    return {
        **report_header("dflash2.evaluate/1", sys.argv[1:]),
        **{k: named[k] for k in ("target", "drafter", "draft_vocab", "lookup", "datastore")},
        **record,
    }


def register(app: typer.Typer) -> None:
    app.command()(evaluate)
