"""`dflash2 bench --concurrency N,...`: the prompts through the batched engine with at most N rows
at a time against one at a time (dflash2_mlx.bench_batch), rendered and added to the report."""

from __future__ import annotations

from .bench_view import concurrency_table, fmt_number, lossless_verdict


def run_concurrency_mode(
    pair,
    prompts,
    levels,
    blocks,
    auto,
    lookup_block,
    width_cost,
    max_tokens,
    repeats,
    thinking,
    report,
    console,
    err,
) -> int:
    from rich.text import Text

    from dflash2_mlx.bench_batch import run_concurrency
    from dflash2_mlx.settings import BY_FLAG

    block, source = (blocks[0], BY_FLAG) if blocks else (auto.size, auto.reason)
    if not blocks and auto.note:
        err.print(Text(f"note: {auto.note}", style="yellow"))
    report["settings"].update(
        blocks=[block],
        block_source=source,
        lookup_block=lookup_block,
        lookup_block_source="autotune profile" if lookup_block else "engine default",
        concurrency=levels,
        batch_width_cost="autotune profile" if width_cost else "default model (engine/width.py)",
    )
    console.print(
        Text(
            f"{len(prompts)} prompts · max {max_tokens} tokens · {repeats} repeats · greedy · "
            f"block {block} ({source}) · lookup block {lookup_block or 'default'} · at most "
            f"{', '.join(map(str, levels))} rows at a time vs one at a time",
            style="dim",
        )
    )

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

    result = run_concurrency(
        pair,
        prompts,
        levels,
        max_tokens=max_tokens,
        repeats=repeats,
        block=block,
        lookup_block=lookup_block,
        width_cost=width_cost,
        thinking=thinking,
        progress=progress,
    )
    report["concurrency"] = result
    if result["fallback"]:
        err.print(
            Text(f"note: this target runs one request at a time: {result['fallback']}", "yellow")
        )
    console.print(concurrency_table(result))
    for m in result["mismatches"]:
        err.print(
            Text(
                f"MISMATCH concurrency {m['concurrency']} prompt {m['id']} "
                f"({m['category']}) at token {m['index']}: sequential {m['sequential']} vs "
                f"batched {m['batched']}",
                style="bold red",
            )
        )
    return lossless_verdict(
        console,
        err,
        len(result["mismatches"]),
        "batched output(s) differ from the same prompt run alone",
        "batched outputs identical to the sequential ones",
    )
