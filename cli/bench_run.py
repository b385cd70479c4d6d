"""Running `dflash2 bench` once its options are parsed: load the pair, measure (speed or
autotune, kernels), render and write the JSON. MLX and the models are imported here, inside
the functions, so `dflash2 --help` never loads them."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .bench_view import (
    env_line,
    fmt_number,
    autotune_table,
    kernels_report,
    lossless_verdict,
    lookup_table,
    speed_tables,
)
from .common import fail


def _load(model, target, drafter, offline, engine, err):
    """The pair and its engine settings; bench is greedy, so no generation_config.json."""
    from rich.text import Text

    from dflash2_mlx.settings import resolve_engine

    from .common import load_resolved

    pair, resolved, _ = load_resolved(
        model, target, drafter, offline, lambda msg: err.print(Text(msg, style="dim")), engine
    )
    return pair, resolved, resolve_engine(engine, pair, resolved, target_dir=None)


def _write_json(report: dict, path: Path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
    return path


def run_bench_command(
    *,
    model,
    target,
    drafter,
    prompts,
    limit,
    max_tokens,
    repeats,
    blocks,
    context,
    json_path,
    plot,
    autotune,
    concurrency,
    kernels,
    kernels_only,
    thinking,
    offline,
    engine,
    argv,
) -> int:
    from rich.console import Console
    from rich.text import Text

    console, err = Console(highlight=False), Console(stderr=True, highlight=False)
    for c in (console, err):  # piped to a file: wide enough for the tables
        if not c.is_terminal:
            c.width = max(c.width, 120)

    from dflash2_mlx import bench as B
    from dflash2_mlx.prompts import load_prompts

    chosen = None
    if not kernels_only:
        chosen = B.select_prompts(load_prompts(prompts), limit)  # fail fast, before any model
    env = B.environment()
    report: dict = {
        "schema": B.SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "dflash2 " + " ".join(argv),
        "environment": env,
    }
    console.print(Text(env_line(env), style="dim"))
    code = 0
    if not kernels_only:
        from dflash2_mlx import autotune as A

        from dflash2_mlx.settings import check_block

        pair, resolved, settings = _load(model, target, drafter, offline, engine, err)
        trained = settings.block.trained
        for b in blocks:
            check_block(b, trained)
        qsig = A.quant_signature(pair)
        report["pair"] = {
            "name": resolved.name,
            "alias": resolved.alias,
            "target": resolved.target,
            "drafter": resolved.drafter,
            "drafter_version": pair.drafter.config.version,
            "draft_vocab": pair.drafter.draft_vocab_size,
            "lookup": pair.decoder.lookup,
            "datastore": pair.decoder.datastore is not None,
            "trained_block": trained,
            "quantization": qsig,
            "quantization_text": A.describe_quant(qsig),
        }
        report["settings"] = {
            "prompts": str(prompts),
            "limit": limit,
            "prompt_ids": [p.id for p in chosen],
            "max_tokens": max_tokens,
            "repeats": repeats,
            "context": context,
            "sampling": "greedy",
            "thinking": thinking,
        }
        console.print(
            Text(
                f"{resolved.name}: {A.describe_quant(qsig)}; drafter DFlash"
                f"{'2' if pair.drafter.config.version == 2 else ' v1'}, trained "
                f"block {trained}",
                style="dim",
            )
        )
        if autotune:
            code = _autotune(
                A,
                pair,
                resolved,
                chosen,
                blocks,
                trained,
                max_tokens,
                repeats,
                context,
                thinking,
                report,
                console,
                err,
            )
        elif concurrency:
            from .bench_concurrency import run_concurrency_mode

            code = run_concurrency_mode(
                pair,
                chosen,
                concurrency,
                blocks,
                settings.block,
                settings.lookup_block,
                settings.width_cost,
                max_tokens,
                repeats,
                thinking,
                report,
                console,
                err,
            )
        else:
            code = _speed(
                B,
                pair,
                chosen,
                blocks,
                settings.block,
                settings.lookup_block,
                max_tokens,
                repeats,
                context,
                thinking,
                report,
                json_path,
                plot,
                console,
                err,
            )
    if kernels:
        report["kernels"] = kernels_report(20, console, err)
    path = _write_json(report, json_path)
    console.print(Text(f"results: {path}", style="dim"))
    return code


def _autotune(
    A,
    pair,
    resolved,
    prompts,
    blocks,
    trained,
    max_tokens,
    repeats,
    context,
    thinking,
    report,
    console,
    err,
) -> int:
    from rich.text import Text

    top = blocks[0] if blocks else trained
    profile = A.autotune(
        pair,
        prompts,
        target=resolved.target,
        drafter=resolved.drafter,
        max_block=top,
        context=context,
        repeats=max(repeats, 5),
        max_tokens=max_tokens,
        thinking=thinking,
        progress=lambda msg: err.print(Text(msg, style="dim")),
    )
    saved = A.save_profile(profile)
    report["autotune"] = dict(profile, path=str(saved))
    acc = profile["acceptance"]
    console.print(autotune_table(profile))
    console.print(
        Text(
            f"calibration: {acc['rounds']} rounds at block {acc['block']} on "
            f"{acc['prompts']} prompts, τ {acc['tau']:.2f}, "
            f"{1 - acc['drafter_share']:.0%} drafted by lookup (no draft pass); "
            "p(draft k accepted | "
            "1..k-1 accepted) = " + ", ".join(f"{p:.2f}" for p in acc["position_probs"])
        )
    )
    if profile["cap"]:
        console.print(Text(f"note: {profile['cap_reason']}", style="yellow"))
    best = next(r for r in profile["table"] if r["block"] == profile["chosen_block"])
    console.print(
        Text(
            f"chosen block {profile['chosen_block']}: {best['expected_tokens']:.2f} "
            f"tokens/round in {best['round_ms']:.1f} ms ≈ {best['expected_tps']:.1f} "
            "tok/s expected",
            style="bold green",
        )
    )
    lookup = profile["lookup"]
    if lookup["table"]:
        console.print(lookup_table(profile))
    console.print(
        Text(
            f"lookup block: {lookup['chosen'] or 'engine default'} ({lookup['reason']}"
            f"; {acc.get('lookup_rounds', 0)} lookup rounds at lookup block "
            f"{lookup['calibration_block']}, τ {acc.get('lookup_tau', 0):.2f})",
            style="bold green" if lookup["chosen"] else "dim",
        )
    )
    console.print(
        Text(f"profile: {saved} (chat and serve use it when no --block is given)", style="dim")
    )
    return 0


def _speed(
    B,
    pair,
    prompts,
    blocks,
    auto,
    lookup_block,
    max_tokens,
    repeats,
    context,
    thinking,
    report,
    json_path,
    plot,
    console,
    err,
) -> int:
    from rich.text import Text

    from dflash2_mlx.settings import BY_FLAG

    source = BY_FLAG
    if not blocks:  # the rule chat and serve use (dflash2_mlx.settings)
        blocks, source = [auto.size], auto.reason
        if auto.note:
            err.print(Text(f"note: {auto.note}", style="yellow"))
    report["settings"].update(
        blocks=blocks,
        block_source=source,
        lookup_block=lookup_block,
        lookup_block_source="autotune profile" if lookup_block else "engine default",
    )
    console.print(
        Text(
            f"{len(prompts)} prompts · max {max_tokens} tokens · {repeats} repeats · "
            f"greedy · block {', '.join(map(str, blocks))} ({source}) · lookup block "
            f"{lookup_block or 'default'}",
            style="dim",
        )
    )

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

    run = B.run_bench(
        pair,
        prompts,
        blocks,
        max_tokens=max_tokens,
        repeats=repeats,
        thinking=thinking,
        lookup_block=lookup_block,
        progress=progress,
    )
    report.update(run)
    err.print(
        Text(
            f"verify cost at context {context}: widths {', '.join(map(str, [1] + blocks))}",
            style="dim",
        )
    )
    vc = B.verify_costs(pair, [1] + blocks, context=context)
    report["verify_cost"] = {
        "context": vc["context"],
        "repeats": vc["repeats"],
        "ms": {str(k): v for k, v in vc["ms"].items()},
        "ratio": {str(k): v for k, v in vc["ratio"].items()},
    }
    for res in report["results"]:
        res["summary"]["verify_cost_ratio"] = vc["ratio"].get(res["block"])
    for t in speed_tables(report):
        console.print(t)
    console.print(
        Text(
            "verify cost ms by width: " + ", ".join(f"{k}: {v:.2f}" for k, v in vc["ms"].items()),
            style="dim",
        )
    )
    if plot is not False:
        png = Path(plot) if plot is not None else Path(json_path).with_suffix(".png")
        try:
            from dflash2_mlx.bench_plot import write_plot

            write_plot(report, png)
            report["plot"] = str(png)
            console.print(Text(f"plot: {png}", style="dim"))
        except ImportError:
            report["plot"] = None
            err.print(
                Text(
                    "note: matplotlib is not installed: no plot (pip install matplotlib)",
                    style="yellow",
                )
            )
    for m in run["mismatches"]:
        err.print(
            Text(
                f"MISMATCH block {m['block']} prompt {m['id']} ({m['category']}) at "
                f"token {m['index']}: plain {m['plain']} vs dflash2 {m['dflash2']}",
                style="bold red",
            )
        )
    return lossless_verdict(
        console,
        err,
        len(run["mismatches"]),
        "dflash2 output(s) differ from plain greedy decoding",
        "outputs identical to plain greedy decoding",
    )
