"""Aggregate throughput of the batched engine (engine/batch.py) on the embedded SmolLM2 pair,
greedy: the same held-out chat prompts run one after another through the single-sequence
engine (today's serving order) and through BatchDecoder with at most 1, 2, 4 (and 8) rows.
Aggregate tokens/s = all generated tokens / wall time of the whole set (prefills included),
in one process, arms interleaved per repeat; outputs must equal the sequential ones.
Usage: nice -n 10 python batch_throughput.py OUT.json [--prompts N] [--max-tokens N]
       [--repeats N] [--batches 1,2,4]"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import dflash2_mlx as d2
from dflash2_mlx import bench as B
from dflash2_mlx import bench_env
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids


def sequential(pair, prompts, params):
    t0 = time.perf_counter()
    outs = [pair.generate(ids, params)[0] for ids in prompts]
    return outs, time.perf_counter() - t0, {}


def batched(pair, prompts, params, max_batch):
    outs = [[] for _ in prompts]
    rounds, rows, draft_ms, verify_ms = 0, 0, 0.0, 0.0
    t0 = time.perf_counter()
    seen = set()
    for i, ev in pair.stream_batch(prompts, params, max_batch):
        outs[i].extend(ev.tokens)
        if not ev.prefill:
            rows += 1
            draft_ms += ev.draft_ms
            if (ev.verify_ms, ev.batch_size) not in seen:  # one verify per round
                seen.add((ev.verify_ms, ev.batch_size))
                rounds += 1
                verify_ms += ev.verify_ms
    wall = time.perf_counter() - t0
    return (
        outs,
        wall,
        {
            "rounds": rounds,
            "mean_batch": round(rows / max(rounds, 1), 3),
            "draft_ms": round(draft_ms, 1),
            "verify_ms": round(verify_ms, 1),
        },
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batches", default="1,2,4")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    chosen = B.select_prompts(load_prompts("heldout"), args.prompts)
    prompts = [chat_prompt_ids(pair.tokenizer, p.messages) for p in chosen]
    params = d2.GenerationParams(max_tokens=args.max_tokens)
    sequential(pair, prompts[:2], d2.GenerationParams(max_tokens=8))  # warm-up
    batched(pair, prompts[:2], d2.GenerationParams(max_tokens=8), 2)
    arms = {"sequential": lambda: sequential(pair, prompts, params)}
    for b in batches:
        arms[f"batch {b}"] = lambda b=b: batched(pair, prompts, params, b)
    walls = {name: [] for name in arms}
    details, reference = {}, None
    identical = {name: True for name in arms}
    for _ in range(args.repeats):
        for name, arm in arms.items():
            outs, wall, info = arm()
            reference = reference or outs
            identical[name] &= outs == reference
            walls[name].append(wall)
            details[name] = info
            print(name, round(wall, 2), info, flush=True)
    tokens = sum(len(o) for o in reference)
    base = statistics.median(walls["sequential"])
    arms_out = {
        name: {
            "wall_s": [round(w, 3) for w in ws],
            "aggregate_tps": round(tokens / statistics.median(ws), 3),
            "vs_sequential": round(base / statistics.median(ws), 3),
            "identical_to_sequential": identical[name],
            **details[name],
        }
        for name, ws in walls.items()
    }
    env = bench_env.environment()
    res = {
        "what": "Greedy chat requests on the embedded SmolLM2-135M pair (shipped drafter, "
        "context lookup 3, block 8): aggregate tokens/s (all tokens / wall time of "
        "the set, prefills included), sequential single-engine runs vs the batched "
        "engine with at most N rows; median of the repeats; the machine is shared "
        "with other jobs.",
        "command": "nice -n 10 python docs/results/scripts/batch_throughput.py "
        + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {k: env[k] for k in ("chip", "blas", "blas_threads", "mlx", "device")},
        "prompts": [p.id for p in chosen],
        "max_tokens": args.max_tokens,
        "tokens": tokens,
        "arms": arms_out,
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
