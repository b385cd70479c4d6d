"""Sampled decoding speed on the embedded pair: plain mlx-lm (`generate_step` with its own
sampler) vs dflash2 with speculation off (block 0 below) and at each block (lookup block 12),
at each temperature, seeds interleaved per prompt (the arms' outputs differ: each is its own
sample). The 7 held-out bench prompts x <= 128 tokens, tok/s after the first token, summed
over prompts and seeds. Usage:
  python sampled_speed.py OUT.json TEMPS SEEDS [BLOCKS]   e.g. 0.7,1.0 1,2 2,3,4"""

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import json
import sys
import time

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from dflash2_mlx import GenerationParams, GenerationStats, SamplingParams
from dflash2_mlx import load_pair
from dflash2_mlx.bench import chat_prompt_ids, select_prompts
from dflash2_mlx.bench_env import environment
from dflash2_mlx.prompts import load_prompts

MAX_TOKENS = 128
out_path, temps, seeds = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
blocks = [int(b) for b in (sys.argv[4] if len(sys.argv) > 4 else "2,3,4").split(",")]
pair = load_pair("smollm2-135m")
eos = pair.eos_ids


def plain(ids, temperature, seed):
    mx.random.seed(seed)
    n, t0 = 0, None
    sampler = make_sampler(temp=temperature)
    for tok, _ in generate_step(mx.array(ids), pair.model, max_tokens=MAX_TOKENS, sampler=sampler):
        t0 = t0 or time.perf_counter()
        n += 1
        if int(tok) in eos:
            break
    return {"tokens": n, "seconds": time.perf_counter() - t0}


def dflash2(ids, temperature, seed, block):
    stats, t0 = GenerationStats(), None
    params = GenerationParams(
        max_tokens=MAX_TOKENS,
        block_size=block or None,
        lookup_block=12 if block else None,
        speculative=block > 0,
        stop_token_ids=eos,
        sampling=SamplingParams(temperature=temperature, seed=seed),
    )
    for ev in pair.stream(list(ids), params):
        t0 = t0 or time.perf_counter()
        stats.add(ev)
    return {"tokens": stats.committed, "seconds": time.perf_counter() - t0, "rounds": stats.rounds}


arms = ["plain"] + [f"block{b}" for b in [0] + blocks]
rows = []
for t in map(float, temps):
    for p in select_prompts(load_prompts("heldout"), 7):
        ids = chat_prompt_ids(pair.tokenizer, p.messages)
        for seed in map(int, seeds):
            row = {"temperature": t, "id": p.id, "category": p.category, "seed": seed}
            for a in arms:
                row[a] = plain(ids, t, seed) if a == "plain" else dflash2(ids, t, seed, int(a[5:]))
            rows.append(row)
            print(json.dumps(row), flush=True)
summary = {}
for t in map(float, temps):
    rs = [r for r in rows if r["temperature"] == t]
    s = {}
    for a in arms:
        n, sec = sum(r[a]["tokens"] - 1 for r in rs), sum(r[a]["seconds"] for r in rs)
        s[a] = {"tokens": n, "seconds": round(sec, 2), "tps": round(n / sec, 3)}
        if a != "plain":
            rounds = sum(r[a]["rounds"] for r in rs)
            s[a]["tau"] = round(sum(r[a]["tokens"] for r in rs) / rounds, 3)
            s[a]["vs_plain_total"] = round(s[a]["tps"] / s["plain"]["tps"], 3)
    summary[str(t)] = s
print(json.dumps(summary, indent=1))
report = {"environment": environment(), "max_tokens": MAX_TOKENS, "summary": summary, "rows": rows}
with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
