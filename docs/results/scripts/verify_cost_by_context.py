"""A verify's and a draft pass's cost by context length on the embedded SmolLM2 pair: median ms
of one verify forward per width and of one drafter round per block, on a warm cache holding
N tokens (dflash2_mlx.costs, as the autotuner times them), and cost(w) / cost(1).
Usage: python verify_cost_by_context.py OUT.json [--contexts 256,1024,2048,4096] [--repeats 5]"""

import argparse
import json
from pathlib import Path

import dflash2_mlx as d2
from dflash2_mlx import bench_env
from dflash2_mlx import costs
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.registry import EMBEDDED_DRAFTER


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--contexts", default="256,1024,2048,4096")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    rows = {}
    for ctx in (int(c) for c in args.contexts.split(",")):
        v = costs.verify_costs(pair, (1, 2, 3, 4, 6, 8), context=ctx, repeats=args.repeats)
        d = costs.draft_costs(pair, (2, 3, 4, 6, 8), context=ctx, repeats=args.repeats)
        rows[str(ctx)] = {"verify_ms": v["ms"], "verify_ratio": v["ratio"], "draft_ms": d["ms"]}
        print(ctx, json.dumps(rows[str(ctx)]), flush=True)
    res = {
        "what": "Verify forward (anchor + drafts) ms per width and drafter round ms per block on "
        "a warm cache of N tokens, embedded SmolLM2-135M pair, medians; ratio = cost(w)/cost(1).",
        "command": f"python docs/results/scripts/verify_cost_by_context.py OUT "
        f"--contexts {args.contexts} --repeats {args.repeats}",
        "environment": bench_env.environment(),
        "by_context": rows,
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
