"""Measure a drafter with the real engine: τ per category, temperature and block size on
held-out prompts (`dflash2 evaluate`; speed is `dflash2 bench`). Results are plain dicts,
written as JSON by the callers."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

from ..api import Pair
from ..engine.events import GenerationStats
from ..engine.generation import GenerationParams
from ..sampling import SEEDS, SamplingParams
from ..prompts import Prompt
from ..settings import check_block
from ..text import chat_prompt_ids


# Measured when no block sizes are given: those below the drafter's trained size, and that size.
DEFAULT_BLOCKS = (4, 8, 16)


def default_blocks(trained: int) -> tuple[int, ...]:
    """DEFAULT_BLOCKS below `trained` (the drafter's trained block size), then `trained`."""
    return tuple(b for b in DEFAULT_BLOCKS if b < trained) + (trained,)


def measure_tau(
    pair: Pair,
    prompts: Sequence[Prompt],
    *,
    block_sizes: Sequence[int] | None = None,
    temperatures=(0.0, 1.0),
    max_tokens: int = 128,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    filters: Mapping[str, Any] | None = None,
) -> dict:
    """τ (mean committed tokens per round, bonus included) per temperature, block and category.
    No `block_sizes`: default_blocks; one above the drafter's trained size is a ParameterError.
    `filters`: top_p / top_k / min_p of every sampled run (a model's own settings, e.g.
    Qwen3's top_k 20, top_p 0.95). `progress(done, total)` after each generation."""
    out: dict = {}
    trained = pair.drafter.config.block_size
    block_sizes = default_blocks(trained) if block_sizes is None else block_sizes
    for block in block_sizes:  # refused, not skipped: a skipped one would leave a hole
        check_block(block, trained, "block_sizes")
    done, runs = 0, len(temperatures) * len(block_sizes) * len(prompts)
    for temp in temperatures:
        for block in block_sizes:
            per_cat: dict[str, GenerationStats] = defaultdict(GenerationStats)
            total = GenerationStats()
            for i, p in enumerate(prompts):
                ids = chat_prompt_ids(pair.tokenizer, p.messages)
                params = GenerationParams(
                    max_tokens=max_tokens,
                    block_size=block,
                    sampling=SamplingParams(
                        temperature=temp, seed=(seed + i) % SEEDS, **(filters or {})
                    ),
                    backoff=False,  # τ of the block itself: every drafter round drafts
                )
                for ev in pair.stream(ids, params):
                    per_cat[p.category].add(ev)
                    total.add(ev)
                done += 1
                if progress is not None:
                    progress(done, runs)
            out[f"T={temp:g}/B={block}"] = {
                "tau": round(total.tau, 4),
                "acceptance_rate": round(total.acceptance_rate, 4),
                "rounds": total.rounds,
                "lookup_rounds": total.lookup_rounds,
                "datastore_rounds": total.datastore_rounds,
                "per_category": {c: round(s.tau, 4) for c, s in sorted(per_cat.items())},
            }
    return out
