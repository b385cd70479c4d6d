"""A drafter that backs off when its drafts are seldom accepted (engine/generation.py
BACKOFF_*) vs never backing off, vs plain mlx-lm sampling: sampled requests at a high
temperature (and greedy ones, where it should not fire) on the embedded pair, arms
interleaved per prompt and seed. Writes a JSON of tokens/s (wall and CPU) per arm.

    python docs/results/scripts/drafter_backoff_ab.py OUT.json [--temps 1.5,0.0] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import dflash2_mlx  # noqa: F401  (before mlx: the BLAS binding)
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from dflash2_mlx import load_pair
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.engine import generation
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.sampling import SamplingParams
from dflash2_mlx.text import chat_prompt_ids

PROMPTS = [
    "Write a short story about a dragon who is afraid of the dark.",
    "Tell me something interesting about your day.",
    "What should I cook tonight? Give me three ideas.",
    "Explain why the sky is blue to a ten-year-old.",
]


def run_dflash(pair, ids, temp, seed, tokens, backoff: bool):
    saved = generation.BACKOFF_AFTER
    generation.BACKOFF_AFTER = saved if backoff else 10**9
    try:
        params = GenerationParams(
            max_tokens=tokens, sampling=SamplingParams(temperature=temp, seed=seed), block_size=4
        )
        t0, c0 = time.perf_counter(), time.process_time()
        out, stats = pair.generate(ids, params)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        generation.BACKOFF_AFTER = saved
    return dict(
        tokens=len(out),
        wall=wall,
        cpu=cpu,
        rounds=stats.rounds,
        drafted=stats.drafted,
        tau=stats.tau,
    )


def run_plain(pair, ids, temp, seed, tokens):
    mx.random.seed(seed)
    sampler = make_sampler(temp=temp)
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for tok, _ in generate_step(mx.array(ids), pair.model, max_tokens=tokens, sampler=sampler):
        n += 1
        if int(tok) in pair.eos_ids:
            break
    return dict(tokens=n, wall=time.perf_counter() - t0, cpu=time.process_time() - c0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--temps", default="1.5,0.0")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    pair = load_pair(str(ensure_smollm2()))
    rows = []
    for temp in [float(t) for t in a.temps.split(",")]:
        for prompt in PROMPTS:
            ids = chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": prompt}])
            for seed in range(1, a.seeds + 1):
                row = dict(temp=temp, prompt=prompt[:40], seed=seed)
                row["backoff"] = run_dflash(pair, ids, temp, seed, a.tokens, True)
                row["always"] = run_dflash(pair, ids, temp, seed, a.tokens, False)
                row["plain"] = run_plain(pair, ids, temp, seed, a.tokens)
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for temp in sorted({r["temp"] for r in rows}):
        sel = [r for r in rows if r["temp"] == temp]
        summary[str(temp)] = {
            arm: {
                "tok_per_s": sum(r[arm]["tokens"] for r in sel) / sum(r[arm]["wall"] for r in sel),
                "tok_per_cpu_s": sum(r[arm]["tokens"] for r in sel)
                / sum(r[arm]["cpu"] for r in sel),
            }
            for arm in ("backoff", "always", "plain")
        }
    meta = dict(
        machine=platform.processor() or platform.machine(),
        load=open("/proc/loadavg").read().split()[:3],
    )
    json.dump(dict(meta=meta, summary=summary, rows=rows), open(a.out, "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
