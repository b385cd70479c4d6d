"""Several `dflash2 bench --json` runs (and the autotunes behind them) in one results file: per
run the settings, median and total speedup, tok/s, τ, identical outputs, each prompt's speedup
and the machine's load; per group of runs the medians and their median and mean.

Usage: python bench_runs_summary.py OUT.json "what was measured" \
         --autotune LABEL=autotune.json [--autotune ...] --group NAME=run1.json,run2.json [...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def run_record(path: Path) -> dict:
    d = json.loads(path.read_text())
    if len(d.get("results", [])) != 1:
        raise SystemExit(
            f"{path}: a run of one block is summarised; it has {len(d.get('results', []))}"
        )
    r = d["results"][0]
    s, settings = r["summary"], d["settings"]
    return {
        "run": path.stem,
        "created": d["created"],
        "command": d["command"],
        "block": r["block"],
        "block_source": settings["block_source"],
        "lookup_block": settings["lookup_block"],
        "lookup_block_source": settings["lookup_block_source"],
        "median_speedup": s["speedup"],
        "speedup_total": s["speedup_total"],
        "plain_tps": s["plain_tps"],
        "dflash2_tps": s["dflash2_tps"],
        "tau": s["tau"],
        "identical": f"{s['identical']}/{s['prompts']}",
        "per_prompt_speedup": {row["id"]: row["speedup"] for row in r["rows"]},
        "machine_load": d["machine_load"],
    }


def autotune_record(path: Path) -> dict:
    d = json.loads(path.read_text())
    a = d["autotune"]
    keep = ("chosen_block", "chosen_lookup_block", "verify", "draft", "acceptance", "table")
    return {"command": d["command"], "created": d["created"], **{k: a[k] for k in keep}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("what")
    ap.add_argument("--autotune", action="append", default=[], metavar="LABEL=FILE")
    ap.add_argument("--group", action="append", required=True, metavar="NAME=FILE,FILE")
    args = ap.parse_args()
    groups = {}
    for g in args.group:
        name, files = g.split("=", 1)
        runs = [run_record(Path(f)) for f in files.split(",")]
        medians = [x["median_speedup"] for x in runs]
        groups[name] = {
            "median_speedups": medians,
            "median_of_runs": round(statistics.median(medians), 3),
            "mean_of_runs": round(statistics.mean(medians), 3),
            "runs": runs,
        }
    first = json.loads(Path(args.group[0].split("=", 1)[1].split(",")[0]).read_text())
    out = {
        "what": args.what,
        "environment": first["environment"],
        "pair": first["pair"],
        "autotunes": {
            label: autotune_record(Path(f)) for label, f in (a.split("=", 1) for a in args.autotune)
        },
        **groups,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, g in groups.items():
        print(name, g["median_speedups"], "median", g["median_of_runs"], "mean", g["mean_of_runs"])


if __name__ == "__main__":
    main()
