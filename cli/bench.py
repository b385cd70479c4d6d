"""`dflash2 bench [MODEL]`: plain mlx-lm decoding vs dflash2, the block-size autotuner, and the
kernel micro-benchmarks. Options are parsed here; the measurements live in dflash2_mlx.bench and
dflash2_mlx.autotune (imported inside the command, so `dflash2 --help` never loads MLX)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from .common import (
    DraftVocabOpt,
    DrafterOpt,
    FullVocabOpt,
    LookupOpt,
    ModelArg,
    OfflineOpt,
    TargetOpt,
    ThinkingOpt,
    engine_flags,
    fail,
)


def parse_blocks(values: Optional[List[str]]) -> list[int]:
    """'--block 4 --block 8' or '--block 4,8,16' -> [4, 8, 16] (sorted, unique)."""
    out: set[int] = set()
    for value in values or []:
        for part in str(value).replace(" ", ",").split(","):
            if not part:
                continue
            try:
                b = int(part)
            except ValueError:
                fail(f"--block needs integers (e.g. --block 8 or --block 4,8,16), got {part!r}")
            if b < 1:
                fail(f"--block must be >= 1, got {b}")
            out.add(b)
    return sorted(out)


def default_json_path() -> Path:
    return Path("results") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"


def bench(
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
    max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens generated per prompt."),
    repeats: int = typer.Option(3, "--repeats", help="Timed runs per prompt (medians)."),
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
    ),
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        help="PNG of speedup and τ per category (default: the JSON path with "
        ".png; needs matplotlib).",
        show_default=False,
    ),
    no_plot: bool = typer.Option(False, "--no-plot", help="Write no PNG."),
    autotune: bool = typer.Option(
        False,
        "--autotune",
        help="Measure verify cost per width, draft cost and per-position "
        "acceptance, pick the block with the most expected tokens/s and store it as this "
        "machine's profile (chat and serve use it when no --block is given).",
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
):
    """Benchmark plain mlx-lm decoding against dflash2 (greedy, same prompt ids, outputs
    checked token for token), or autotune the block size for this machine.

    Reports tokens/s both ways and their ratio, τ, draft and verify ms per round, the verify
    cost ratio cost(B)/cost(1), BLAS, mlx version and device; writes JSON and a PNG.
    Exit code 1 if any dflash2 output differs from plain decoding.

    Example: dflash2 bench qwen3-4b --limit 14 --block 4,8,16

    Example: dflash2 bench qwen3.8-27b-4bit --autotune

    Example: dflash2 bench --kernels
    """
    blocks = parse_blocks(block)
    for flag, value, low in (
        ("--max-tokens", max_tokens, 2),
        ("--repeats", repeats, 1),
        ("--context", context, 1),
    ):
        if value < low:
            fail(f"{flag} must be >= {low}, got {value}")
    if limit is not None and limit < 1:
        fail(f"--limit must be >= 1, got {limit}")
    if autotune and len(blocks) > 1:
        fail("--autotune takes one --block (the largest block size to consider)")
    if plot is not None and no_plot:
        fail("--plot and --no-plot contradict each other")
    kernels_only = kernels and not autotune and model is None and target is None and drafter is None
    if plot is not None and (autotune or kernels_only):
        fail("--plot needs the speed benchmark (it plots speedup and τ per category)")
    return run_bench_command(
        model=model,
        target=target,
        drafter=drafter,
        prompts=prompts,
        limit=limit,
        max_tokens=max_tokens,
        repeats=repeats,
        blocks=blocks,
        context=context,
        json_path=json_path or default_json_path(),
        plot=False if no_plot else plot,
        autotune=autotune,
        kernels=kernels,
        kernels_only=kernels_only,
        thinking=thinking,
        offline=offline,
        engine=engine_flags(lookup=lookup, full_vocab=full_vocab, draft_vocab=draft_vocab),
        argv=sys.argv[1:],
    )


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


# ------------------------------------------------------------------------------ running
# Everything below runs inside the command: MLX and the models are imported here, not above.


def _fmt(x, spec: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def _load(model, target, drafter, offline, engine, err):
    """The pair and its engine settings; bench is greedy, so no generation_config.json."""
    from rich.text import Text

    from dflash2_mlx.settings import resolve_engine

    from .common import load_resolved

    pair, resolved, _ = load_resolved(
        model, target, drafter, offline, lambda msg: err.print(Text(msg, style="dim")), engine
    )
    return pair, resolved, resolve_engine(engine, pair, resolved, target_dir=None)


def _env_line(env: dict) -> str:
    threads = f" x{env['blas_threads']}" if env.get("blas_threads") else ""
    return (
        f"device {env['device']} ({env.get('chip', '?')}) · mlx {env['mlx']} · mlx-lm "
        f"{env['mlx_lm']} · BLAS {env['blas']}{threads} · {env['platform']}"
    )


def speed_tables(report: dict):
    """One rich table per block size: categories, then all prompts."""
    from rich.table import Table

    tables = []
    ratios = report.get("verify_cost", {}).get("ratio", {})
    for res in report["results"]:
        b = res["block"]
        ratio = ratios.get(str(b))
        t = Table(
            title=f"block {b}"
            + (f" · verify cost({b})/cost(1) = {ratio:.2f}" if ratio is not None else ""),
            title_justify="left",
            header_style="bold",
        )
        for col in (
            "category",
            "prompts",
            "plain tok/s",
            "dflash2 tok/s",
            "speedup",
            "τ",
            "lookup τ",
            "draft ms/rd",
            "verify ms/rd",
            "identical",
        ):
            t.add_column(col, justify="left" if col == "category" else "right")

        def add(name, s, style=None):
            same = f"{s['identical']}/{s['prompts']}"
            t.add_row(
                name,
                str(s["prompts"]),
                _fmt(s["plain_tps"]),
                _fmt(s["dflash2_tps"]),
                _fmt(s["speedup"], ".2f") + ("x" if s["speedup"] is not None else ""),
                _fmt(s["tau"], ".2f"),
                _fmt(s.get("lookup_tau"), ".2f"),
                _fmt(s["draft_ms_per_round"], ".2f"),
                _fmt(s["verify_ms_per_round"], ".2f"),
                same if s["identical"] == s["prompts"] else f"[bold red]{same}[/]",
                style=style,
            )

        for cat, s in res["per_category"].items():
            add(cat, s)
        t.add_section()
        add("all (median)", res["summary"], style="bold")
        tables.append(t)
    return tables


def autotune_table(profile: dict):
    """The measured cost curve and the expected tokens/round and tokens/s per block size."""
    from rich.table import Table
    from rich.text import Text

    probs = profile["acceptance"]["position_probs"]
    ratio = profile["verify"]["ratio"]
    t = Table(
        title=Text(
            "autotune: expected tok/s = E[tokens/round] / (draft ms + verify ms) "
            "per block b; p(b-1) = P(draft b-1 accepted | drafts before it "
            "accepted)"
        ),
        title_justify="left",
        header_style="bold",
    )
    for col in (
        "block",
        "verify ms",
        "x cost(1)",
        "draft ms",
        "round ms",
        "p(b-1)",
        "E tok/round",
        "exp. tok/s",
        "",
    ):
        t.add_column(col, justify="right")
    for r in profile["table"]:
        b = r["block"]
        p = probs[b - 2] if b >= 2 and b - 2 < len(probs) else None
        mark = (
            "◀ chosen" if b == profile["chosen_block"] else ("capped" if not r["allowed"] else "")
        )
        t.add_row(
            str(b),
            f"{r['verify_ms']:.2f}",
            _fmt(ratio.get(str(b)), ".2f"),
            f"{r['draft_ms']:.2f}",
            f"{r['round_ms']:.2f}",
            _fmt(p, ".3f"),
            f"{r['expected_tokens']:.2f}",
            f"{r['expected_tps']:.1f}",
            mark,
            style="bold green"
            if b == profile["chosen_block"]
            else ("dim" if not r["allowed"] else None),
        )
    return t


def lookup_table(profile: dict):
    """Lookup rounds (no draft pass): expected tokens/round and tok/s per lookup block."""
    from rich.table import Table
    from rich.text import Text

    lookup = profile.get("lookup") or {}
    t = Table(
        title=Text(
            "autotune, lookup rounds: each calibration lookup round cut at L "
            "(tokens verified); expected tok/s = E[tokens/round] / verify ms"
        ),
        title_justify="left",
        header_style="bold",
    )
    for col in ("lookup block", "verify ms", "E tok/round", "exp. tok/s", ""):
        t.add_column(col, justify="right")
    for r in lookup.get("table", []):
        chosen = r["lookup_block"] == lookup.get("chosen")
        t.add_row(
            str(r["lookup_block"]),
            f"{r['verify_ms']:.2f}",
            f"{r['expected_tokens']:.2f}",
            f"{r['expected_tps']:.1f}",
            "◀ chosen" if chosen else "",
            style="bold green" if chosen else None,
        )
    return t


def kernels_report(repeats: int, console, err) -> dict:
    from rich.table import Table
    from rich.text import Text

    from dflash2_mlx.kernels import bench_kernels

    res = bench_kernels(repeats=repeats)
    t = Table(
        title=f"kernels (device {res.get('device', '?')}, setting "
        f"{res.get('setting', '?')}, {res.get('repeats')} repeats, median ms)",
        title_justify="left",
        header_style="bold",
    )
    for col in ("op", "case", "reference ms", "kernel ms", "speedup", "max |Δ|"):
        t.add_column(col, justify="left" if col in ("op", "case") else "right")
    for r in res.get("results", []):
        t.add_row(
            r["op"],
            r["case"],
            _fmt(r.get("reference_ms"), ".3f"),
            _fmt(r.get("kernel_ms"), ".3f", "not run"),
            _fmt(r.get("speedup"), ".2f") + ("x" if r.get("speedup") is not None else ""),
            _fmt(r.get("max_abs_diff"), ".2g"),
        )
    console.print(t)
    if not res.get("kernels_run"):
        err.print(
            Text(
                "note: the custom Metal kernels were not run on this machine: "
                + (res.get("note") or "no Metal; reference timings only"),
                style="yellow",
            )
        )
    elif res.get("note"):
        console.print(Text(res["note"], style="dim"))
    return res


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
    console.print(Text(_env_line(env), style="dim"))
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
                f"b{b} {_fmt(r['dflash2_tps'])} tok/s ×{_fmt(r['speedup'], '.2f')} "
                f"τ {r['tau']:.2f} {ok}"
            )
        plain = next(iter(rows.values()))["plain_tps"]
        err.print(
            Text(
                f"[{i}/{n}] {info['id']} ({info['category']}): plain {_fmt(plain)} "
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
            B.write_plot(report, png)
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
    if run["mismatches"]:
        for m in run["mismatches"]:
            err.print(
                Text(
                    f"MISMATCH block {m['block']} prompt {m['id']} ({m['category']}) at "
                    f"token {m['index']}: plain {m['plain']} vs dflash2 {m['dflash2']}",
                    style="bold red",
                )
            )
        err.print(
            Text(
                f"LOSSLESSNESS VIOLATED: {len(run['mismatches'])} dflash2 output(s) differ "
                "from plain greedy decoding (please report this with the JSON)",
                style="bold red",
            )
        )
        return 1
    console.print(Text("all outputs identical to plain greedy decoding", style="green"))
    return 0
