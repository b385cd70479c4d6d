"""What `dflash2 bench` prints: the environment line, the speed, autotune and lookup tables,
and the kernel micro-benchmark table (rich objects; the numbers come from dflash2_mlx)."""

from __future__ import annotations

from rich.text import Text

from .terminal import text_row


def fmt_number(x, spec: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def lossless_verdict(console, err, mismatches: int, differ_from: str, same_as: str) -> int:
    """The exit code of a run that compared outputs: 1 (loudly) if any differed, else 0."""
    from rich.text import Text

    if mismatches:
        err.print(
            Text(
                f"LOSSLESSNESS VIOLATED: {mismatches} {differ_from} "
                "(please report this with the JSON)",
                style="bold red",
            )
        )
        return 1
    console.print(Text(f"all {same_as}", style="green"))
    return 0


def near_tie_line(where: str, m: dict):
    """A parting where the two tokens' logits lie within the rounding of the model's dtype."""
    from rich.text import Text

    return Text(
        f"near-tie {where} (their logits {m['gap']:.2g} apart, within the {m['tolerance']:.2g} "
        "rounding of the model's dtype: float rounding, not a lossless violation)",
        style="yellow",
    )


def env_line(env: dict) -> str:
    threads = f" x{env['blas_threads']}" if env.get("blas_threads") else ""
    if env.get("blas_kernel"):
        threads += f" + {env['blas_kernel']} kernel x{env.get('blas_kernel_threads') or 1}"
        threads += " (larger products chunked over its threads)" if env.get("blas_split") else ""
    return (
        f"device {env['device']} ({env.get('chip', '?')}) · mlx {env['mlx']} · mlx-lm "
        f"{env['mlx_lm']} · BLAS {env['blas']}{threads} · {env['platform']}"
    )


def run_size(prompts: int, max_tokens: int, repeats: int) -> str:
    """What a bench runs, said before it: '7 prompts · max 256 tokens · 1 repeat'."""
    return (
        f"{prompts} prompt{'s' if prompts != 1 else ''} · max {max_tokens} tokens · "
        f"{repeats} repeat{'s' if repeats != 1 else ''}"
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
            "store τ",
            "draft ms/rd",
            "verify ms/rd",
            "identical",
        ):
            t.add_column(col, justify="left" if col == "category" else "right")

        def add(name, s, style=None):
            same = f"{s['identical']}/{s['prompts']}"
            text_row(
                t,
                name,
                str(s["prompts"]),
                fmt_number(s["plain_tps"]),
                fmt_number(s["dflash2_tps"]),
                fmt_number(s["speedup"], ".2f") + ("x" if s["speedup"] is not None else ""),
                fmt_number(s["tau"], ".2f"),
                fmt_number(s.get("lookup_tau"), ".2f"),
                fmt_number(s.get("datastore_tau"), ".2f"),
                fmt_number(s["draft_ms_per_round"], ".2f"),
                fmt_number(s["verify_ms_per_round"], ".2f"),
                Text(same, style="" if s["identical"] == s["prompts"] else "bold red"),
                style=style,
            )

        for cat, s in res["per_category"].items():
            add(cat, s)
        t.add_section()
        add("all", res["summary"], style="bold")
        total = res["summary"].get("speedup_total")
        t.caption = (
            "tok/s and speedup: medians over the prompts"
            + (f" (all tokens over all time: {total:.2f}x)" if total is not None else "")
            + "; τ and ms: over all rounds"
        )
        t.caption_justify = "left"
        tables.append(t)
    return tables


def concurrency_table(result: dict):
    """Sequential vs the batched engine at each concurrency: aggregate tok/s and ratio."""
    from rich.table import Table

    t = Table(
        title="concurrency: aggregate tok/s = all generated tokens / wall time (prefills "
        "included); vs one at a time through the single-sequence engine",
        title_justify="left",
        header_style="bold",
    )
    for col in (
        "max rows",
        "tokens",
        "wall s (median)",
        "aggregate tok/s",
        "vs sequential",
        "rows/round",
        "identical",
    ):
        t.add_column(col, justify="right")
    seq = result["sequential"]
    text_row(
        t,
        "sequential",
        str(seq["tokens"]),
        f"{seq['median_wall_s']:.2f}",
        fmt_number(seq["aggregate_tps"]),
        "1.00x",
        fmt_number(seq["mean_rows_per_round"], ".2f"),
        "—",
        style="dim",
    )
    for r in result["results"]:
        same = f"{r['identical']}/{r['prompts']}"
        text_row(
            t,
            str(r["concurrency"]),
            str(r["tokens"]),
            f"{r['median_wall_s']:.2f}",
            fmt_number(r["aggregate_tps"]),
            fmt_number(r["vs_sequential"], ".2f") + ("x" if r["vs_sequential"] else ""),
            fmt_number(r["mean_rows_per_round"], ".2f"),
            Text(same, style="" if r["identical"] == r["prompts"] else "bold red"),
        )
    return t


def autotune_table(profile: dict):
    """The measured cost curve and the expected tokens/round and tokens/s per block size."""
    from rich.table import Table
    from rich.text import Text

    probs = _measured(profile["acceptance"])
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
        text_row(
            t,
            str(b),
            f"{r['verify_ms']:.2f}",
            fmt_number(ratio.get(str(b)), ".2f"),
            f"{r['draft_ms']:.2f}",
            f"{r['round_ms']:.2f}",
            fmt_number(p, ".3f"),
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
        text_row(
            t,
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
        text_row(
            t,
            r["op"],
            r["case"],
            fmt_number(r.get("reference_ms"), ".3f"),
            fmt_number(r.get("kernel_ms"), ".3f", "not run"),
            fmt_number(r.get("speedup"), ".2f") + ("x" if r.get("speedup") is not None else ""),
            fmt_number(r.get("max_abs_diff"), ".2g"),
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


def _measured(acceptance: dict) -> list:
    """Each draft position's acceptance, None where no calibration round reached it."""
    counts = acceptance.get("position_rounds") or []
    return [
        None if k < len(counts) and counts[k] == 0 else p
        for k, p in enumerate(acceptance["position_probs"])
    ]


def print_block_choice(profile: dict, console) -> None:
    """The calibration, the cost table and the chosen block size."""
    acc = profile["acceptance"]
    console.print(autotune_table(profile))
    console.print(
        Text(
            f"calibration: {acc['rounds']} rounds at block {acc['block']} on "
            f"{acc['prompts']} prompts, τ {acc['tau']:.2f}, "
            f"{1 - acc['drafter_share']:.0%} drafted by lookup (no draft pass); "
            "p(draft k accepted | "
            "1..k-1 accepted) = "
            + ", ".join("—" if p is None else f"{p:.2f}" for p in _measured(acc))
            + (" (— : no round reached it; counted as 0)" if None in _measured(acc) else "")
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
    long = profile.get("long_context")
    if long:  # the same choice at longer contexts (block_schedule.py)
        falls = "; ".join(f"{b} from {c:,} tokens" for c, b in profile["block_by_context"])
        console.print(
            Text(
                f"block by context (costs also timed at {long['context']:,} tokens): "
                + (falls or f"{profile['chosen_block']} at every context"),
                style="green",
            )
        )
    sampled = profile.get("sampled")
    if sampled:  # calibration.py: sampled rounds accept less
        each = "; ".join(
            f"T {c['temperature']:g}: τ {c['tau']:.2f} over {c['rounds']} drafter rounds, "
            + (f"best block {c['chosen_block']}" if c["chosen_block"] else "too few to choose by")
            for c in sampled
        )
        console.print(Text(f"sampled: {each}", style="green"))


def print_lookup_choice(profile: dict, console) -> None:
    """The lookup-block table (if measured) and the lookup block chosen."""
    acc, lookup = profile["acceptance"], profile["lookup"]
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
