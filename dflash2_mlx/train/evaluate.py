"""Measure a drafter with the real engine: τ per category, temperature and block size on
held-out prompts (`dflash2 evaluate`; speed is `dflash2 bench`). Results are plain dicts,
written as JSON by the callers."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from ..api import Pair
from ..engine.events import GenerationStats
from ..engine.generation import GenerationParams
from ..engine.sampling import SamplingParams
from ..prompts import Prompt
from ..text import chat_prompt_ids


def measure_tau(
    pair: Pair,
    prompts: Sequence[Prompt],
    *,
    block_sizes=(4, 8, 16),
    temperatures=(0.0, 1.0),
    max_tokens: int = 128,
    seed: int = 0,
) -> dict:
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
                params = GenerationParams(
                    max_tokens=max_tokens,
                    block_size=block,
                    sampling=SamplingParams(temperature=temp, seed=seed + i),
                )
                for ev in pair.stream(ids, params):
                    per_cat[p.category].add(ev)
                    total.add(ev)
            out[f"T={temp:g}/B={block}"] = {
                "tau": round(total.tau, 4),
                "acceptance_rate": round(total.acceptance_rate, 4),
                "rounds": total.rounds,
                "lookup_rounds": total.lookup_rounds,
                "datastore_rounds": total.datastore_rounds,
                "per_category": {c: round(s.tau, 4) for c, s in sorted(per_cat.items())},
            }
    return out
