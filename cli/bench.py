"""`dflash2 bench [MODEL]`: plain mlx-lm decoding vs dflash2, the block-size autotuner, and the
kernel micro-benchmarks. Options are parsed here; the measurements live in dflash2_mlx.bench and
dflash2_mlx.autotune (imported inside the command, so `dflash2 --help` never loads MLX)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from .bench_options import BenchOptions
from .common import (
    output_path,
    given_params,
    DraftVocabOpt,
    DrafterOpt,
    FullVocabOpt,
    LookupOpt,
    NoDatastoreOpt,
    ModelArg,
    OfflineOpt,
    TargetOpt,
    ThinkingOpt,
    engine_flags,
    fail,
    number_list,
)


def parse_ints(values: Optional[List[str]], flag: str, example: str) -> list[int]:
    """'--block 4 --block 8' or '--block 4,8,16' -> [4, 8, 16] (sorted, unique, >= 1)."""
    out = {b for value in values or [] for b in number_list(value, int, flag, example)}
    for b in sorted(out):
        if b < 1:
            fail(f"{flag} must be >= 1, got {b}")
    return sorted(out)


def parse_blocks(values: Optional[List[str]]) -> list[int]:
    return parse_ints(values, "--block", "4,8,16")


def default_json_path() -> Path:
    return Path("results") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"


def bench(
    ctx: typer.Context,
    model: ModelArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    prompts: str = typer.Option(
        "heldout",
        "--prompts",
        help="Prompt set: 'heldout' or 'train' (bundled, with "
        "categories), or a JSONL file of {id, category, messages}.",
    ),
    limit: Optional[int] = typer.Option(
        None,
        "--limit",
        help="Use N prompts, taken round-robin over the categories (default: all).",
        show_default=False,
    ),
    max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens generated per prompt (>= 2)."),
    repeats: int = typer.Option(
        3,
        "--repeats",
        help="Timed runs per prompt (medians); unless given: 5 with --autotune, 20 per "
        "kernel with --kernels alone.",
    ),
    block: Optional[List[str]] = typer.Option(
        None,
        "--block",
        metavar="<int,...>",
        help="Block size(s) to measure: --block 8, "
        "--block 4,8,16 or repeated "
        "(default: this machine's autotune profile, else the alias's recommendation, else the "
        "drafter's trained size). "
        "With --autotune: the largest block considered.",
        show_default=False,
    ),
    context: int = typer.Option(
        256, "--context", help="Cache depth (tokens) at which verify and draft costs are timed."
    ),
    json_path: Optional[Path] = typer.Option(
        None,
        "--json",
        help="Write the results here (default: bench-<timestamp>.json in results/).",
        show_default=False,
        callback=output_path("--json"),
    ),
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        help="PNG of speedup and τ per category (default: the JSON path with "
        ".png; needs matplotlib).",
        show_default=False,
        callback=output_path("--plot"),
    ),
    no_plot: bool = typer.Option(False, "--no-plot", help="Write no PNG."),
    autotune: bool = typer.Option(
        False,
        "--autotune",
        help="Measure verify cost per width, draft cost and per-position "
        "acceptance, pick the block with the most expected tokens/s and store it as this "
        "machine's profile (chat and serve use it when no --block is given).",
    ),
    concurrency: Optional[List[str]] = typer.Option(
        None,
        "--concurrency",
        metavar="<int,...>",
        help="Concurrency mode: run the prompts through the batched engine with at most N "
        "rows at a time (--concurrency 1,2,4,8) against one at a time through the "
        "single-sequence engine; aggregate tokens/s, ratios, rows per round, outputs "
        "checked. One block size.",
        show_default=False,
    ),
    kernels: bool = typer.Option(
        False,
        "--kernels",
        help="Time the custom Metal kernels against their references. "
        "Alone (no MODEL, --target, --drafter or --autotune) it loads no model.",
    ),
    thinking: ThinkingOpt = None,
    offline: OfflineOpt = False,
    full_vocab: FullVocabOpt = False,
    draft_vocab: DraftVocabOpt = None,
    lookup: LookupOpt = None,
    no_datastore: NoDatastoreOpt = False,
):
    """Benchmark plain mlx-lm decoding against dflash2 (greedy, same prompt ids, outputs
    checked token for token), or autotune the block size for this machine.

    With --concurrency: sequential single-sequence runs vs the batched engine at each
    concurrency (aggregate tokens/s, ratio, rows per round), outputs checked the same way.

    Reports tokens/s both ways and their ratio, τ, draft and verify ms per round, the verify
    cost ratio cost(B)/cost(1), BLAS, mlx version and device; writes JSON and a PNG.
    Exit code 1 if any dflash2 output differs from plain decoding.

    Example: dflash2 bench qwen3-4b --limit 14 --block 4,8,16

    Example: dflash2 bench qwen3.8-27b-4bit --autotune

    Example: dflash2 bench --concurrency 1,2,4,8 --limit 8

    Example: dflash2 bench --kernels
    """
    options = BenchOptions(
        model=model,
        target=target,
        drafter=drafter,
        prompts=prompts,
        limit=limit,
        max_tokens=max_tokens,
        repeats=repeats,
        blocks=parse_blocks(block),
        context=context,
        json_path=json_path or default_json_path(),
        plot=plot,
        no_plot=no_plot,
        autotune=autotune,
        concurrency=parse_ints(concurrency, "--concurrency", "1,2,4,8"),
        kernels=kernels,
        thinking=thinking,
        offline=offline,
        engine_flags=engine_flags(
            lookup=lookup,
            datastore=not no_datastore,
            full_vocab=full_vocab,
            draft_vocab=draft_vocab,
        ),
        argv=sys.argv[1:],
        given=given_params(ctx),
    )
    options.check()
    from .bench_run import run_bench_command

    return run_bench_command(options)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
