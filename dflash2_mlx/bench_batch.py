"""Concurrency measurement: the bench prompts through the batched engine (engine/batch.py) with
at most N rows at a time, against the same prompts one after another through the
single-sequence engine (how `dflash2 serve` ran them before batching).

Used by `dflash2 bench --concurrency`. Greedy; the same prompt ids, max tokens, block and
lookup block in every arm. Aggregate tokens/s = all generated tokens (the first one included)
over the wall time of the whole set, prefills included. Arms are interleaved per repeat (their
order rotated) so drift hits them alike; medians over repeats. Every batched output is compared
token by token with the sequential output of the same repeat. Plain dicts, ready for JSON.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from .bench import first_mismatch
from .divergence import parting
from .engine.generation import GenerationParams
from .sampling import SamplingParams
from .prompts import Prompt
from .text import chat_prompt_ids

SEQUENTIAL = "sequential"


@dataclass
class ArmRun:
    """One pass of an arm over all prompts."""

    outputs: list[list[int]]
    seconds: float  # wall time of the whole set, prefills included
    rounds: float = 0.0  # target verify forwards (a batched round counts once)
    row_rounds: int = 0  # rows verified, summed over rounds

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def rows_per_round(self) -> float | None:
        return self.row_rounds / self.rounds if self.rounds else None


def run_sequential(pair, prompts: Sequence[list[int]], params: GenerationParams) -> ArmRun:
    """Each prompt alone, one after another, through the single-sequence engine."""
    outputs, rounds = [], 0
    t0 = time.perf_counter()
    for ids in prompts:
        out, stats = pair.generate(ids, params)
        outputs.append(out)
        rounds += stats.rounds
    return ArmRun(outputs, time.perf_counter() - t0, rounds, rounds)


def run_batched(
    pair,
    prompts: Sequence[list[int]],
    params: GenerationParams,
    max_batch: int,
    width_cost: Callable[[int, int], float] | None = None,
) -> ArmRun:
    """All prompts through one BatchDecoder with at most `max_batch` rows at a time. A round's
    verify forward covers `batch_size` rows, so each row's event counts 1/batch_size of it."""
    outputs: list[list[int]] = [[] for _ in prompts]
    rounds, rows = 0.0, 0
    t0 = time.perf_counter()
    for i, ev in pair.stream_batch(prompts, params, max_batch, width_cost):
        outputs[i].extend(ev.tokens)
        if not ev.prefill:
            rows += 1
            rounds += 1.0 / ev.batch_size
    return ArmRun(outputs, time.perf_counter() - t0, round(rounds, 6), rows)


def _arm_summary(runs: list[ArmRun], base_s: float | None) -> dict:
    wall = statistics.median(r.seconds for r in runs)
    last = runs[-1]
    tps = last.tokens / wall if wall > 0 else None
    return {
        "wall_s": [round(r.seconds, 4) for r in runs],
        "median_wall_s": round(wall, 4),
        "tokens": last.tokens,
        "aggregate_tps": round(tps, 4) if tps else None,
        "vs_sequential": round(base_s / wall, 4) if base_s and wall > 0 else None,
        "rounds": round(last.rounds, 3),
        "mean_rows_per_round": round(last.rows_per_round, 4) if last.rows_per_round else None,
    }


def run_concurrency(
    pair,
    prompts: Sequence[Prompt],
    levels: Sequence[int],
    *,
    max_tokens: int = 128,
    repeats: int = 1,
    block: int | None = None,
    lookup_block: int | None = None,
    width_cost: Callable[[int, int], float] | None = None,
    thinking: bool | None = None,
    warmup: bool = True,
    progress: Callable[[str, ArmRun], None] | None = None,
) -> dict:
    """Sequential vs the batched engine at each concurrency level (max rows), greedy.
    `width_cost`: the batched rounds' verify cost model (settings.EngineSettings.width_cost).

    Returns {"levels", "batched_engine", "fallback", "sequential": {...}, "results":
    [{"concurrency", "aggregate_tps", "vs_sequential", "mean_rows_per_round", "identical",
    "prompts", ...}], "all_identical", "mismatches": [{"concurrency", "id", "category",
    "index", "sequential", "batched"}]}. `progress(arm name, run)` after each pass."""
    levels = sorted({int(n) for n in levels})
    params = GenerationParams(
        max_tokens=max_tokens,
        block_size=block,
        lookup_block=lookup_block,
        sampling=SamplingParams(temperature=0.0),
    )
    encoded = [chat_prompt_ids(pair.tokenizer, p.messages, thinking=thinking) for p in prompts]
    if warmup and encoded:
        short = replace(params, max_tokens=min(8, max_tokens))
        run_sequential(pair, encoded[:1], short)
        run_batched(pair, encoded[:2], short, 2)
    arms: dict[str, Callable[[], ArmRun]] = {
        SEQUENTIAL: lambda: run_sequential(pair, encoded, params)
    }
    for n in levels:
        arms[f"batch {n}"] = lambda n=n: run_batched(pair, encoded, params, n, width_cost)
    runs: dict[str, list[ArmRun]] = {name: [] for name in arms}
    check = _OutputCheck(
        prompts, levels, lambda j, ref, out, m: parting(pair.model, encoded[j], ref, out, m)
    )
    for rep in range(max(1, repeats)):
        for name in _rotated(list(arms), rep):
            run = arms[name]()
            runs[name].append(run)
            if progress is not None:
                progress(name, run)
        for n in levels:
            check.compare(n, runs[SEQUENTIAL][-1].outputs, runs[f"batch {n}"][-1].outputs)
    fallback = pair.batch(1).fallback
    return {
        "levels": levels,
        "batched_engine": fallback is None,
        "fallback": fallback,
        "prompt_tokens": [len(ids) for ids in encoded],
        **_summaries(runs, levels, check),
        "all_identical": not check.mismatches,
        "mismatches": check.mismatches,
    }


def _rotated(names: list[str], rep: int) -> list[str]:
    """The arms' order in repeat `rep`: the sequential reference first, the batched rotated."""
    batched_names = names[1:]
    k = rep % max(len(batched_names), 1)
    return [SEQUENTIAL] + batched_names[k:] + batched_names[:k]


class _OutputCheck:
    """Batched outputs against the sequential ones, per level and prompt; the first
    mismatch of each (level, prompt) is kept."""

    def __init__(self, prompts: Sequence[Prompt], levels: list[int], parted: Callable):
        self.prompts, self.parted = prompts, parted  # parted(j, ref, out, m): divergence's
        self.identical = {n: [True] * len(prompts) for n in levels}
        self.mismatches: list[dict] = []
        self.real: set[tuple[int, int]] = set()  # (level, prompt) with a parting no near-tie

    def compare(self, n: int, reference: list[list[int]], outs: list[list[int]]) -> None:
        """Every repeat's first parting until one is no near-tie: a tie never hides it."""
        for j, (p, ref, out) in enumerate(zip(self.prompts, reference, outs)):
            m = first_mismatch(ref, out)
            if m is not None and (n, j) not in self.real:
                self.identical[n][j] = False
                where = self.parted(j, ref, out, m)
                if not where["near_tie"]:
                    self.real.add((n, j))
                self.mismatches.append(
                    {
                        "concurrency": n,
                        "id": p.id,
                        "category": p.category,
                        "index": m,
                        "sequential": ref[m : m + 8],
                        "batched": out[m : m + 8],
                        **where,
                    }
                )


def _summaries(runs: dict[str, list[ArmRun]], levels: list[int], check: _OutputCheck) -> dict:
    """{"sequential": its summary, "results": one per level, timed against sequential}."""
    base_s = statistics.median(r.seconds for r in runs[SEQUENTIAL])
    results = []
    for n in levels:
        res = {"concurrency": n, **_arm_summary(runs[f"batch {n}"], base_s)}
        res.update(prompts=len(check.prompts), identical=sum(check.identical[n]))
        results.append(res)
    return {"sequential": _arm_summary(runs[SEQUENTIAL], base_s), "results": results}
