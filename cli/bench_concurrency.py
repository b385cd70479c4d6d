"""`dflash2 bench --concurrency N,...`: the prompts through the batched engine with at most N rows
at a time against one at a time (dflash2_mlx.bench_batch), rendered and added to the report."""

from __future__ import annotations

from .bench_load import say_busy, watch_load
from .bench_options import BenchRun
from .bench_view import concurrency_table, fmt_number, lossless_verdict, near_tie_line, run_size


def run_concurrency_mode(run: BenchRun) -> int:
    """Sequential vs batched at each --concurrency level; the report's `concurrency` section."""
    from dflash2_mlx.bench_batch import run_concurrency

    o, engine = run.options, run.engine
    block = _concurrency_settings(run)
    measured = watch_load(run)
    result = run_concurrency(
        run.pair,
        run.prompts,
        o.concurrency,
        max_tokens=o.max_tokens,
        repeats=o.repeats,
        block=block,
        lookup_block=engine.lookup_block,
        width_cost=engine.width_cost,
        thinking=o.thinking,
        progress=_progress(run.err),
    )
    run.report["concurrency"] = result
    from dflash2_mlx.bench_env import CONCURRENCY_BUSY

    note = measured(CONCURRENCY_BUSY)
    code = _render(result, run.console, run.err)
    say_busy(run, note)
    return code


def _concurrency_settings(run: BenchRun) -> int:
    """The one block measured (given, else the rule chat and serve use), recorded and printed."""
    from rich.text import Text

    from dflash2_mlx.settings import BY_PROFILE

    from .bench_options import chosen_blocks

    o = run.options
    lookup_block, width_cost, levels = run.engine.lookup_block, run.engine.width_cost, o.concurrency
    blocks, source = chosen_blocks(run)  # one: the options refuse more beside --concurrency
    block = blocks[0]
    run.report["settings"].update(
        concurrency=levels,
        batch_width_cost=BY_PROFILE if width_cost else "default model (engine/width.py)",
    )
    run.console.print(
        Text(
            f"{run_size(len(run.prompts), o.max_tokens, o.repeats)} · greedy · block {block} ({source}) · lookup block {lookup_block or 'default'} · "
            f"at most {', '.join(map(str, levels))} rows at a time vs one at a time",
            style="dim",
        )
    )
    return block


def _progress(err):
    """One stderr line per finished run (sequential, or batched at one level)."""
    from rich.text import Text

    def progress(name, run):
        rows = fmt_number(run.rows_per_round, ".2f")
        err.print(
            Text(
                f"{name}: {run.tokens} tokens in {run.seconds:.2f} s "
                f"({fmt_number(run.tokens / run.seconds if run.seconds else None)} tok/s), "
                f"{rows} rows a round",
                style="dim",
            )
        )

    return progress


def _render(result: dict, console, err) -> int:
    """The table, any fallback note and mismatches, then the lossless verdict (the exit code)."""
    from rich.text import Text

    if result["fallback"]:
        err.print(
            Text(f"note: this target runs one request at a time: {result['fallback']}", "yellow")
        )
    console.print(concurrency_table(result))
    for m in result["mismatches"]:
        where = (
            f"concurrency {m['concurrency']} prompt {m['id']} ({m['category']}) at token "
            f"{m['index']}: sequential {m['sequential']} vs batched {m['batched']}"
        )
        err.print(
            near_tie_line(where, m) if m["near_tie"] else Text(f"MISMATCH {where}", "bold red")
        )
    return lossless_verdict(
        console,
        err,
        sum(not m["near_tie"] for m in result["mismatches"]),
        "batched output(s) differ from the same prompt run alone",
        "batched outputs identical to the sequential ones",
    )
