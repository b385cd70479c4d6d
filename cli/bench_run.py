"""Running `dflash2 bench` once its options are parsed: load the pair, measure (speed or
autotune, kernels), render and write the JSON. MLX and the models are imported here, inside
the functions, so `dflash2 --help` never loads them."""

from __future__ import annotations

import json
from pathlib import Path

from .bench_view import (
    near_tie_line,
    env_line,
    fmt_number,
    kernels_report,
    lossless_verdict,
    print_block_choice,
    print_lookup_choice,
    run_size,
    speed_tables,
)
from .bench_load import say_busy, watch_load
from .bench_options import BenchOptions, BenchRun, chosen_blocks
from .common import check_thinking_flag, check_writable, fail
from .loading import load_engine


def _write_json(report: dict, path: Path) -> Path:
    """Written whole or not at all: a full disk leaves the report that was there."""
    from dflash2_mlx.paths import write_whole

    try:
        return write_whole(path, json.dumps(report, indent=2, default=str) + "\n")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")


def run_bench_command(options: BenchOptions) -> int:
    """Measures what `options` asks, prints the tables, writes the JSON; the exit code."""
    from rich.text import Text

    from dflash2_mlx import bench as B
    from dflash2_mlx import bench_env as E
    from dflash2_mlx.prompts import load_prompts

    reads = {"--prompts": options.prompts}
    check_writable(options.json_path, "--json", reads)
    if options.plot_path:
        check_writable(options.plot_path, "--plot", reads)
    console, err = _consoles()
    chosen = None
    if not options.kernels_only:  # fail fast, before any model
        chosen = B.select_prompts(load_prompts(options.prompts), options.limit)
    report = E.report_header(B.SCHEMA, options.argv)
    console.print(Text(env_line(report["environment"]), style="dim"))
    code = 0
    if not options.kernels_only:
        run = _load_run(options, chosen, report, console, err)
        if options.autotune:
            code = _autotune(run)
        elif options.concurrency:
            from .bench_concurrency import run_concurrency_mode

            code = run_concurrency_mode(run)
        else:
            code = _speed(run)
    if options.kernels:
        report["kernels"] = kernels_report(options.kernel_repeats, console, err)
    path = _write_json(report, options.json_path)
    console.print(Text(f"results: {path}", style="dim"))
    return code


def _consoles():
    """(stdout, stderr) rich consoles; piped to a file, wide enough for the tables."""
    from rich.console import Console

    console, err = Console(highlight=False), Console(stderr=True, highlight=False)
    for c in (console, err):
        if not c.is_terminal:
            c.width = max(c.width, 200)  # every column whole (120 cut some headers)
    return console, err


def _load_run(options: BenchOptions, prompts, report: dict, console, err) -> BenchRun:
    """Loads the pair, checks the blocks against it and records pair and settings in `report`."""
    from rich.text import Text

    from dflash2_mlx import autotune as A
    from dflash2_mlx import bench as B
    from dflash2_mlx import bench_env as E
    from dflash2_mlx.costs import check_context
    from dflash2_mlx.settings import check_block

    o = options

    def say(msg: str) -> None:
        err.print(Text(msg, style="dim"))

    pair, resolved, engine = load_engine(  # greedy: no generation_config.json
        o.model, o.target, o.drafter, o.offline, say, o.engine_flags, sampling=False
    )
    check_thinking_flag(pair.tokenizer, options.thinking)
    B.check_prompt_lengths(pair, prompts, options.max_tokens, options.thinking)
    trained = engine.block.trained
    for b in options.blocks:
        check_block(b, trained)
    if not options.concurrency:  # the speed benchmark and --autotune time at this depth
        widest = max(options.blocks or [trained])
        widest = max(A.LOOKUP_WIDTHS) if options.autotune else widest
        check_context(pair, options.context, widest, name="--context")
    report["pair"] = E.pair_record(pair, resolved)
    report["settings"] = {
        "prompts": str(options.prompts),
        "limit": options.limit,
        "prompt_ids": [p.id for p in prompts],
        "max_tokens": options.max_tokens,
        "repeats": options.repeats,
        "context": options.context,
        "sampling": "greedy",
        "thinking": options.thinking,
    }
    console.print(
        Text(
            f"{resolved.name}: {report['pair']['quantization_text']}; drafter DFlash"
            f"{'2' if pair.drafter.config.version == 2 else ' v1'}, trained "
            f"block {trained}",
            style="dim",
        )
    )
    return BenchRun(options, pair, resolved, engine, prompts, report, console, err)


def _autotune(run: BenchRun) -> int:
    """`--autotune`: measures, stores this machine's profile and prints why it chose."""
    from rich.text import Text

    from dflash2_mlx import autotune as A
    from dflash2_mlx import bench_env as E
    from dflash2_mlx.errors import ParameterError

    o, console = run.options, run.console
    A.check_storable()  # before minutes of measuring, not after
    measured = watch_load(run)
    try:
        profile = A.autotune(
            run.pair,
            run.prompts,
            target=run.resolved.target,
            drafter=run.resolved.drafter,
            max_block=o.blocks[0] if o.blocks else run.engine.block.trained,
            context=o.context,
            repeats=o.autotune_repeats,
            max_tokens=o.max_tokens,
            thinking=o.thinking,
            progress=lambda msg: run.err.print(Text(msg, style="dim")),
        )
    except ParameterError:  # implausible timings, too few rounds: was the machine busy?
        say_busy(run, measured(E.AUTOTUNE_BUSY))
        raise
    note = measured(E.AUTOTUNE_BUSY)
    run.report["settings"]["repeats"] = o.autotune_repeats
    before = A.load_profile(profile["key"])
    saved = A.save_profile(profile)
    run.report["autotune"] = dict(profile, path=str(saved))
    print_block_choice(profile, console)
    print_lookup_choice(profile, console)
    console.print(
        Text(f"profile: {saved} (chat and serve use it when no --block is given)", style="dim")
    )
    if before is not None:
        console.print(Text(_replaced(before, profile), style="dim"))
    say_busy(run, note)
    return 0


def _replaced(before: dict, after: dict) -> str:
    """What a rerun changed in the profile it replaced."""
    changes = [
        f"{name} {before.get(field)} → {after.get(field)}"
        for name, field in (
            ("block", "chosen_block"),
            ("lookup block", "chosen_lookup_block"),
            ("blocks by context", "block_by_context"),
            ("blocks by temperature", "block_by_temperature"),
        )
        if before.get(field) != after.get(field)
    ]
    return f"it replaces the profile of {before.get('created', 'an earlier run')}: " + (
        "; ".join(changes) if changes else "the same choices"
    )


def _speed(run: BenchRun) -> int:
    """The speed benchmark: plain vs dflash2 per block, verify costs, tables, plot, verdict."""
    from dflash2_mlx import bench as B

    o = run.options
    blocks = _speed_settings(run)
    measured = watch_load(run)
    result = B.run_bench(
        run.pair,
        run.prompts,
        blocks,
        max_tokens=o.max_tokens,
        repeats=o.repeats,
        thinking=o.thinking,
        lookup_block=run.engine.lookup_block,
        progress=_speed_progress(run.err),
        block_by_context=run.report["settings"]["block_by_context"],
        verify_cost=run.engine.verify_cost if run.report["settings"]["block_by_context"] else None,
    )
    run.report.update(result)
    note = measured()
    vc = _verify_cost(run, blocks)
    for t in speed_tables(run.report):
        run.console.print(t)
    _print_verify_ms(vc, run.console)
    say_busy(run, note)
    if o.plot_path is not False:
        _plot(run)
    return _mismatch_verdict(result["mismatches"], run.console, run.err)


def _speed_settings(run: BenchRun) -> list[int]:
    """The blocks to measure (given, else the rule chat and serve use), recorded and printed."""
    from rich.text import Text

    o, lookup_block = run.options, run.engine.lookup_block
    blocks, source = chosen_blocks(run)
    by_context = () if o.blocks else run.engine.block.by_context  # the autotuned block's
    run.report["settings"].update(block_by_context=by_context)
    run.console.print(
        Text(
            f"{run_size(len(run.prompts), o.max_tokens, o.repeats)} · greedy · block {', '.join(map(str, blocks))} ({source}) · lookup block "
            f"{lookup_block or 'default'}",
            style="dim",
        )
    )
    return blocks


def _speed_progress(err):
    """The per-prompt progress line of the speed benchmark (stderr)."""
    from rich.text import Text

    def progress(i, n, info, rows):
        parts = []
        for b, r in rows.items():
            ok = "✓" if r["identical"] else "✗ MISMATCH"
            parts.append(
                f"b{b} {fmt_number(r['dflash2_tps'])} tok/s ×{fmt_number(r['speedup'], '.2f')} "
                f"τ {r['tau']:.2f} {ok}"
            )
        plain = next(iter(rows.values()))["plain_tps"]
        err.print(
            Text(
                f"[{i}/{n}] {info['id']} ({info['category']}): plain {fmt_number(plain)} "
                f"tok/s · " + " · ".join(parts),
                style="dim",
            )
        )

    return progress


def _verify_cost(run: BenchRun, blocks: list[int]) -> dict:
    """Times a verify at widths 1 and `blocks`; records it, and each result's cost ratio."""
    from rich.text import Text

    from dflash2_mlx import bench as B

    context = run.options.context
    run.err.print(
        Text(
            f"verify cost at context {context}: widths {', '.join(map(str, [1] + blocks))}",
            style="dim",
        )
    )
    vc = B.verify_costs(run.pair, [1] + blocks, context=context)
    run.report["verify_cost"] = {
        "context": vc["context"],
        "repeats": vc["repeats"],
        "ms": {str(k): v for k, v in vc["ms"].items()},
        "ratio": {str(k): v for k, v in vc["ratio"].items()},
    }
    for res in run.report["results"]:
        res["summary"]["verify_cost_ratio"] = vc["ratio"].get(res["block"])
    return vc


def _print_verify_ms(vc: dict, console) -> None:
    from rich.text import Text

    console.print(
        Text(
            "verify cost ms by width: " + ", ".join(f"{k}: {v:.2f}" for k, v in vc["ms"].items()),
            style="dim",
        )
    )


def _plot(run: BenchRun) -> None:
    """The PNG (--plot, else next to the JSON); a note instead if matplotlib is missing."""
    from rich.text import Text

    png = run.options.png
    try:
        from dflash2_mlx.bench_plot import write_plot

        write_plot(run.report, png)
        run.report["plot"] = str(png)
        run.console.print(Text(f"plot: {png}", style="dim"))
    except OSError as exc:  # the JSON is still written
        run.report["plot"] = None
        run.err.print(Text(f"note: no plot: cannot write {png}: {exc}", style="yellow"))
    except ImportError:
        run.report["plot"] = None
        run.err.print(
            Text(
                "note: matplotlib is not installed: no plot (pip install matplotlib)",
                style="yellow",
            )
        )


def _mismatch_verdict(mismatches: list[dict], console, err) -> int:
    """Each mismatch: a near-tie (the two tokens' logits within the rounding of the model's
    dtype: a verify's and a one-token forward's shapes may split it) in yellow, any other in
    red; then the lossless verdict (exit code 1 if any was not a near-tie)."""
    from rich.text import Text

    for m in mismatches:
        where = (
            f"block {m['block']} prompt {m['id']} ({m['category']}) at token {m['index']}: "
            f"plain {m['plain']} vs dflash2 {m['dflash2']}"
        )
        err.print(
            near_tie_line(where, m) if m["near_tie"] else Text(f"MISMATCH {where}", "bold red")
        )
    return lossless_verdict(
        console,
        err,
        sum(not m["near_tie"] for m in mismatches),
        "dflash2 output(s) differ from plain greedy decoding",
        "outputs identical to plain greedy decoding, up to the near-ties above"
        if mismatches
        else "outputs identical to plain greedy decoding",
    )
