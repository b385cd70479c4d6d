"""The draft gate (engine/gate.py) on the embedded SmolLM2 pair: greedy chat prompts decoded by
plain mlx-lm, by dflash2 with the drafter every round (gate off) and by dflash2 with the gate
(plain rounds where the drafter does not pay), arms in the order plain, off, on, on, off, plain
per prompt (a load that drifts linearly cancels); tokens/s after the first token, medians of
the two runs; outputs compared with plain decoding -> JSON.
Usage: python draft_gate_ab.py OUT.json [--prompts 7] [--max-tokens 256] [--block 4]
       [--lookup-block 16]"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import dflash2_mlx as d2  # binds the optimized BLAS before MLX loads

from dflash2_mlx import bench as B
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids

ORDER = ("plain", "off", "on", "on", "off", "plain")


def run_prompt(pair, ids, args) -> dict:
    runs = {name: [] for name in ("plain", "off", "on")}
    for name in ORDER:
        if name == "plain":
            timed = B.plain_decode(pair, ids, args.max_tokens)
        else:
            timed = B.dflash2_decode(
                pair, ids, args.max_tokens, args.block, args.lookup_block, name == "on"
            )
        runs[name].append(timed)
    ref = runs["plain"][0].tokens
    row = {}
    for name, timed in runs.items():
        row[f"{name}_tps"] = round(statistics.median(t.tps or 0.0 for t in timed), 3)
        row[f"{name}_identical"] = all(t.tokens == ref for t in timed)
        if timed[0].stats is not None:
            st = timed[-1].stats
            row[f"{name}_tau"] = round(st.tau, 3)
            row[f"{name}_rounds"] = st.rounds
            row[f"{name}_plain_rounds"] = st.plain_rounds
    row["tokens"] = len(ref)
    row["on/off"] = round(row["on_tps"] / row["off_tps"], 3)
    row["on/plain"] = round(row["on_tps"] / row["plain_tps"], 3)
    row["off/plain"] = round(row["off_tps"] / row["plain_tps"], 3)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--prompts", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--lookup-block", type=int, default=16)
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    chosen = B.select_prompts(load_prompts("heldout"), args.prompts)
    warm = chat_prompt_ids(pair.tokenizer, chosen[0].messages)
    B.plain_decode(pair, warm, 8)
    B.dflash2_decode(pair, warm, 8, args.block, args.lookup_block)
    rows = {}
    for p in chosen:
        rows[p.id] = run_prompt(pair, chat_prompt_ids(pair.tokenizer, p.messages), args)
        print(p.id, rows[p.id], flush=True)

    def median(key):
        return round(statistics.median(r[key] for r in rows.values()), 3)

    env = B.environment()
    res = {
        "what": "Greedy chat prompts, tokens/s after the first token: plain mlx-lm vs dflash2 "
        "with the drafter every round (off) vs with the draft gate (on); median of 2 runs "
        "per arm, arms ABCCBA per prompt.",
        "command": "python docs/results/scripts/draft_gate_ab.py " + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {k: env[k] for k in ("chip", "blas", "blas_threads", "mlx", "device")},
        "block": args.block,
        "lookup_block": args.lookup_block,
        "max_tokens": args.max_tokens,
        "median": {k: median(k) for k in ("on/off", "on/plain", "off/plain")},
        "worst": {k: min(r[k] for r in rows.values()) for k in ("on/plain", "off/plain")},
        "all_identical": all(r["on_identical"] and r["off_identical"] for r in rows.values()),
        "prompts": rows,
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("median", "worst", "all_identical")}))


if __name__ == "__main__":
    main()
