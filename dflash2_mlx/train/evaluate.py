"""Measure a drafter with the real engine: τ per category and block size, and speed vs plain
decoding, on held-out prompts. Results are plain dicts, written as JSON by the callers."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Sequence

import mlx.core as mx

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
                "per_category": {c: round(s.tau, 4) for c, s in sorted(per_cat.items())},
            }
    return out


def _plain_mlx_lm(pair: Pair, ids: list[int], max_tokens: int) -> tuple[list[int], float]:
    """Baseline: mlx-lm's own greedy generate_step; returns tokens and decode seconds
    (first token excluded, as for dflash2)."""
    from mlx_lm.generate import generate_step

    eos = pair.eos_ids
    out, t_first = [], None
    for tok, _ in generate_step(mx.array(ids), pair.model, max_tokens=max_tokens,
                                sampler=lambda x: mx.argmax(x, axis=-1)):
        tok = int(tok)
        if t_first is None:
            t_first = time.perf_counter()
        out.append(tok)
        if tok in eos:
            break
    return out, time.perf_counter() - t_first


def measure_speed(pair: Pair, prompts: Sequence[Prompt], *, block_size: int | None = None,
                  max_tokens: int = 128, repeats: int = 1) -> dict:
    """Greedy tokens/s of plain mlx-lm decoding vs dflash2 on the same prompt ids; outputs
    must be identical. Medians over prompts (each prompt: best of `repeats`)."""
    rows = []
    warm = chat_prompt_ids(pair.tokenizer, prompts[0].messages)
    _plain_mlx_lm(pair, warm, 8)
    pair.generate(warm, GenerationParams(max_tokens=8, block_size=block_size))
    for p in prompts:
        ids = chat_prompt_ids(pair.tokenizer, p.messages)
        base_s, spec_s = [], []
        for _ in range(repeats):
            base, secs = _plain_mlx_lm(pair, ids, max_tokens)
            base_s.append(secs)
            spec, stats = pair.generate(ids, GenerationParams(max_tokens=max_tokens,
                                                              block_size=block_size))
            spec_s.append(stats.decode_ms / 1000)
        rows.append({
            "id": p.id, "category": p.category, "tokens": len(base), "identical": base == spec,
            "plain_tps": (len(base) - 1) / min(base_s), "dflash2_tps": (len(spec) - 1) / min(spec_s),
            "tau": stats.tau, "draft_ms_per_round": stats.draft_ms / max(stats.rounds, 1),
            "verify_ms_per_round": stats.verify_ms / max(stats.rounds, 1),
        })
    speedups = [r["dflash2_tps"] / r["plain_tps"] for r in rows if r["plain_tps"] > 0]
    return {
        "median_speedup": round(statistics.median(speedups), 3) if speedups else None,
        "median_plain_tps": round(statistics.median(r["plain_tps"] for r in rows), 2),
        "median_dflash2_tps": round(statistics.median(r["dflash2_tps"] for r in rows), 2),
        "all_identical": all(r["identical"] for r in rows),
        "rows": rows,
    }


def verify_cost_ratios(pair: Pair, widths=(1, 2, 4, 8, 16), context: int = 256, reps: int = 5) -> dict:
    """cost(k-token verify) / cost(1-token) with a warm cache of `context` tokens (medians)."""
    adapter = pair.decoder.target
    cache = adapter.make_cache()
    adapter.prefill(mx.array([[i % 1000 + 10 for i in range(context)]]), cache)
    times = {}
    for k in widths:
        samples = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            fwd = adapter.forward(mx.array([[11] * k]), cache)
            mx.eval(fwd.logits, fwd.features)
            samples.append(time.perf_counter() - t0)
            for c in cache:
                c.trim(k)
        times[k] = statistics.median(samples[1:])
    return {"ms": {k: round(v * 1000, 2) for k, v in times.items()},
            "ratio": {k: round(v / times[widths[0]], 3) for k, v in times.items()}}
