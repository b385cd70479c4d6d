"""Measure a drafter with the real engine: τ per category and block size, and speed vs plain
decoding, on held-out prompts. Results are plain dicts, written as JSON by the callers."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from .. import bench
from ..api import Pair
from ..engine.events import GenerationStats
from ..engine.loop import GenerationParams
from ..engine.sampling import SamplingParams
from ..prompts import Prompt
from ..text import chat_prompt_ids


def measure_tau(pair: Pair, prompts: Sequence[Prompt], *, block_sizes=(4, 8, 16),
                temperatures=(0.0, 1.0), max_tokens: int = 128, seed: int = 0) -> dict:
    """τ (mean committed tokens per round, bonus included) per temperature, block and category."""
    out: dict = {}
    trained = pair.drafter.config.block_size
    for temp in temperatures:
        for block in block_sizes:
            if block > trained:
                continue
            per_cat: dict[str, GenerationStats] = defaultdict(GenerationStats)
            total = GenerationStats()
            for i, p in enumerate(prompts):
                ids = chat_prompt_ids(pair.tokenizer, p.messages)
                params = GenerationParams(max_tokens=max_tokens, block_size=block,
                                          sampling=SamplingParams(temperature=temp, seed=seed + i))
                for ev in pair.stream(ids, params):
                    per_cat[p.category].add(ev)
                    total.add(ev)
            out[f"T={temp:g}/B={block}"] = {
                "tau": round(total.tau, 4),
                "acceptance_rate": round(total.acceptance_rate, 4),
                "rounds": total.rounds,
                "lookup_rounds": total.lookup_rounds,
                "per_category": {c: round(s.tau, 4) for c, s in sorted(per_cat.items())},
            }
    return out


def measure_speed(pair: Pair, prompts: Sequence[Prompt], *, block_size: int | None = None,
                  max_tokens: int = 128, repeats: int = 1) -> dict:
    """Greedy tokens/s of plain mlx-lm decoding vs dflash2 on the same prompt ids; outputs
    must be identical. Medians over prompts (each prompt: median of `repeats`).
    A thin view of dflash2_mlx.bench.run_bench (which `dflash2 bench` uses too)."""
    block = block_size or pair.drafter.config.block_size
    run = bench.run_bench(pair, prompts, [block], max_tokens=max_tokens, repeats=repeats)
    res = run["results"][0]
    s = res["summary"]
    return {
        "median_speedup": s["speedup"],
        "median_plain_tps": s["plain_tps"],
        "median_dflash2_tps": s["dflash2_tps"],
        "all_identical": run["all_identical"],
        "rows": res["rows"],
    }


def verify_cost_ratios(pair: Pair, widths=(1, 2, 4, 8, 16), context: int = 256, reps: int = 5) -> dict:
    """cost(k-token verify) / cost(smallest width) with a warm cache of `context` tokens
    (medians; dflash2_mlx.bench.verify_costs)."""
    vc = bench.verify_costs(pair, widths, context=context, repeats=reps)
    return {"ms": vc["ms"], "ratio": vc["ratio"]}
