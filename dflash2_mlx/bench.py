"""Speed measurement: plain mlx-lm decoding vs dflash2 on identical prompt token ids.

Used by `dflash2 bench` and by the autotuner (dflash2_mlx.autotune).
The rules: the same prompt ids, max tokens and
sampling (greedy) both ways; a warm-up run first; medians over repeats; greedy outputs compared
token by token. Tokens/s count the tokens after the first (prefill excluded) over the wall time
from the first token to the last, both ways.

The per-round cost curves (verify, batched verify, draft) live in costs.py and are re-exported
here. Everything returns plain dicts, ready for JSON.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import mlx.core as mx

from .costs import batch_verify_costs, draft_costs, verify_costs  # noqa: F401  (re-exported)
from .divergence import parting
from .engine.events import GenerationStats, tau
from .engine.generation import GenerationParams
from .errors import ParameterError
from .sampling import SamplingParams
from .prompts import Prompt
from .text import chat_prompt_ids

SCHEMA = "dflash2.bench/1"


# ----------------------------------------------------------------------------- one generation
@dataclass
class Timed:
    tokens: list[int]
    seconds: float  # wall time from the first token to the last
    stats: GenerationStats | None = None  # dflash2 only

    @property
    def tps(self) -> float | None:
        """Tokens per second after the first token; None when fewer than 2 tokens."""
        n = len(self.tokens) - 1
        return n / self.seconds if n > 0 and self.seconds > 0 else None


def _float32(tokens, logits):
    """A logits processor: mlx-lm's greedy sampler takes the argmax of logits - logsumexp in
    the model's dtype, where bf16 rounding can tie the top two and pick the lower id; greedy
    decoding is the argmax of the logits, which float32 keeps."""
    return logits.astype(mx.float32)


def plain_decode(pair, ids: Sequence[int], max_tokens: int) -> Timed:
    """Baseline: mlx-lm's own greedy `generate_step` on the pair's target, stopping at EOS
    (its log-probabilities in float32: `_float32`)."""
    from mlx_lm.generate import generate_step

    eos = pair.eos_ids
    out: list[int] = []
    t_first = None
    for tok, _ in generate_step(
        mx.array(list(ids)),
        pair.model,
        max_tokens=max_tokens,
        sampler=lambda x: mx.argmax(x, axis=-1),
        logits_processors=[_float32],
    ):
        tok = int(tok)
        if t_first is None:
            t_first = time.perf_counter()
        out.append(tok)
        if tok in eos:
            break
    secs = time.perf_counter() - t_first if t_first is not None else 0.0
    return Timed(out, secs)


def dflash2_decode(
    pair,
    ids: Sequence[int],
    max_tokens: int,
    block: int | None,
    lookup_block: int | None = None,
    block_by_context: tuple[tuple[int, int], ...] = (),
    verify_cost: Callable[[int, int], float] | None = None,
) -> Timed:
    """dflash2, greedy, at `block` (None: the drafter's trained block size; from the contexts
    of `block_by_context` on, its blocks), lookup rounds up to `lookup_block` (None: the
    engine's default); `verify_cost`: GenerationParams.verify_cost."""
    stats = GenerationStats()
    out: list[int] = []
    t_first = None
    params = GenerationParams(
        max_tokens=max_tokens,
        block_size=block,
        lookup_block=lookup_block,
        sampling=SamplingParams(temperature=0.0),
        block_by_context=block_by_context,
        verify_cost=verify_cost,
    )
    for ev in pair.stream(list(ids), params):
        if t_first is None:
            t_first = time.perf_counter()
        stats.add(ev)
        out.extend(ev.tokens)
    secs = time.perf_counter() - t_first if t_first is not None else 0.0
    return Timed(out, secs, stats)


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first difference of two token lists (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----------------------------------------------------------------------------- prompts
def select_prompts(prompts: Sequence[Prompt], limit: int | None) -> list[Prompt]:
    """At most `limit` prompts, taken round-robin over the categories (file order within each),
    so that a small limit still covers every category; all of them when limit is None."""
    if limit is None or limit >= len(prompts):
        return list(prompts)
    by_cat: dict[str, list[Prompt]] = defaultdict(list)
    for p in prompts:
        by_cat[p.category].append(p)
    queues = list(by_cat.values())
    out: list[Prompt] = []
    i = 0
    while len(out) < limit:
        q = queues[i % len(queues)]
        if q:
            out.append(q.pop(0))
        i += 1
    return out


def check_prompt_lengths(pair, prompts: Sequence[Prompt], max_tokens: int, thinking=None) -> None:
    """A ParameterError naming the first prompt whose ids plus `max_tokens` exceed the model's
    context (it would run past what the model was trained on, slowly, measuring nothing)."""
    from .target.context import default_context_length

    limit = default_context_length(pair.model)
    for p in prompts:
        n = len(chat_prompt_ids(pair.tokenizer, p.messages, thinking=thinking))
        if n + max_tokens > limit:
            raise ParameterError(
                f"prompt {p.id!r}: {n:,} tokens plus max_tokens {max_tokens} exceed the model's "
                f"context ({limit:,} tokens)"
            )


# ----------------------------------------------------------------------------- the benchmark
def _summary(rows: list[dict]) -> dict:
    """Medians over prompts, pooled τ and per-round costs, totals."""

    def med(key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(vals), 4) if vals else None

    rounds = sum(r["rounds"] for r in rows)

    def per_round(key):
        return round(sum(r[key] for r in rows) / rounds, 4) if rounds else None

    accepted = sum(r["accepted"] for r in rows)
    plain_s = sum(r["plain_s"] for r in rows)
    spec_s = sum(r["dflash2_s"] for r in rows)
    tokens = sum(max(r["tokens"] - 1, 0) for r in rows)
    plain_total = tokens / plain_s if plain_s > 0 else None
    spec_total = tokens / spec_s if spec_s > 0 else None
    return {
        "prompts": len(rows),
        "identical": sum(1 for r in rows if r["identical"]),
        "tokens": sum(r["tokens"] for r in rows),
        "plain_tps": med("plain_tps"),
        "dflash2_tps": med("dflash2_tps"),
        "speedup": med("speedup"),
        "plain_tps_total": round(plain_total, 4) if plain_total else None,
        "dflash2_tps_total": round(spec_total, 4) if spec_total else None,
        "speedup_total": round(spec_total / plain_total, 4) if plain_total and spec_total else None,
        "tau": round(tau(accepted, rounds), 4) if rounds else None,
        "rounds": rounds,
        "lookup_rounds": sum(r["lookup_rounds"] for r in rows),
        "lookup_tau": _pooled_tau(rows, "lookup"),
        "datastore_rounds": sum(r["datastore_rounds"] for r in rows),
        "datastore_tau": _pooled_tau(rows, "datastore"),
        "draft_ms_per_round": per_round("draft_ms"),
        "verify_ms_per_round": per_round("verify_ms"),
    }


def _pooled_tau(rows: list[dict], source: str) -> float | None:
    """τ of one source's rounds ("lookup", "datastore") over all prompts."""
    n = sum(r[f"{source}_rounds"] for r in rows)
    return round(tau(sum(r[f"{source}_accepted"] for r in rows), n), 4) if n else None


def _row(p: Prompt, ids, plain: list[Timed], spec: list[Timed], mism: int | None) -> dict:
    plain_s = statistics.median(t.seconds for t in plain)
    spec_s = statistics.median(t.seconds for t in spec)
    n = len(spec[-1].tokens)
    m = len(plain[-1].tokens)
    ptps = (m - 1) / plain_s if m > 1 and plain_s > 0 else None
    stps = (n - 1) / spec_s if n > 1 and spec_s > 0 else None
    st = spec[-1].stats
    rounds = st.rounds
    return {
        "id": p.id,
        "category": p.category,
        "prompt_tokens": len(ids),
        "tokens": n,
        "identical": mism is None,
        "first_mismatch": mism,
        "plain_s": round(plain_s, 6),
        "dflash2_s": round(spec_s, 6),
        "plain_tps": round(ptps, 4) if ptps else None,
        "dflash2_tps": round(stps, 4) if stps else None,
        "speedup": round(stps / ptps, 4) if ptps and stps else None,
        "tau": round(st.tau, 4),
        "rounds": rounds,
        "accepted": st.accepted,
        "lookup_rounds": st.lookup_rounds,
        "lookup_accepted": st.lookup_accepted,
        "lookup_tau": round(st.lookup_tau, 4) if st.lookup_rounds else None,  # as the summary's
        "datastore_rounds": st.datastore_rounds,
        "datastore_accepted": st.datastore_accepted,
        "datastore_tau": round(st.datastore_tau, 4) if st.datastore_rounds else None,
        "longest_round": st.longest_round,
        "acceptance_rate": round(st.acceptance_rate, 4),
        "draft_ms": round(statistics.median(t.stats.draft_ms for t in spec), 4),
        "verify_ms": round(statistics.median(t.stats.verify_ms for t in spec), 4),
        "draft_ms_per_round": round(statistics.median(t.stats.draft_ms for t in spec) / rounds, 4)
        if rounds
        else None,
        "verify_ms_per_round": round(statistics.median(t.stats.verify_ms for t in spec) / rounds, 4)
        if rounds
        else None,
        "histogram": {str(k): v for k, v in sorted(st.histogram.items())},
    }


def run_bench(
    pair,
    prompts: Sequence[Prompt],
    blocks: Sequence[int],
    *,
    max_tokens: int = 128,
    repeats: int = 3,
    warmup: bool = True,
    thinking: bool | None = None,
    lookup_block: int | None = None,
    progress: Callable[[int, int, dict, dict[int, dict]], None] | None = None,
    block_by_context: tuple[tuple[int, int], ...] = (),
    verify_cost: Callable[[int, int], float] | None = None,
) -> dict:
    """Plain mlx-lm vs dflash2 at each block size, greedy, on the same prompt ids.

    Per prompt and repeat: one plain run, then one dflash2 run per block (interleaved, so drift
    hits both alike); every dflash2 output is compared with the plain output of the same repeat.
    Returns {"results": [{"block", "summary", "per_category", "rows"}], "all_identical",
    "mismatches": [{"block", "id", "category", "index", "plain", "dflash2"}]}.
    `progress(i, n, prompt_info, rows_by_block)` is called after each prompt.
    `block_by_context`, `verify_cost`: GenerationParams' of every dflash2 run."""
    blocks = [int(b) for b in blocks]
    encoded = [(p, chat_prompt_ids(pair.tokenizer, p.messages, thinking=thinking)) for p in prompts]
    if warmup and encoded:
        ids = encoded[0][1]
        plain_decode(pair, ids, min(16, max_tokens))
        for b in blocks:
            dflash2_decode(
                pair, ids, min(16, max_tokens), b, lookup_block, block_by_context, verify_cost
            )
    rows: dict[int, list[dict]] = {b: [] for b in blocks}
    mismatches: list[dict] = []
    for i, (p, ids) in enumerate(encoded):
        done = _time_prompt(
            pair,
            p,
            ids,
            blocks,
            max_tokens,
            max(1, repeats),
            (lookup_block, block_by_context, verify_cost),
            mismatches,
        )
        for b in blocks:
            rows[b].append(done[b])
        if progress is not None:
            progress(i + 1, len(encoded), {"id": p.id, "category": p.category}, done)
    results = [_block_result(b, rows[b]) for b in blocks]
    return {"results": results, "all_identical": not mismatches, "mismatches": mismatches}


def _time_prompt(
    pair, p: Prompt, ids, blocks, max_tokens, repeats, drafting: tuple, mismatches: list[dict]
) -> dict[int, dict]:
    """One prompt's row per block: `repeats` plain runs, each followed by one dflash2 run per
    block (`drafting`: its lookup_block, block_by_context and verify_cost); the first mismatch
    per block is appended to `mismatches`."""
    plain: list[Timed] = []
    spec: dict[int, list[Timed]] = {b: [] for b in blocks}
    mism: dict[int, int | None] = {b: None for b in blocks}
    real: set[int] = set()  # blocks with a parting that is no near-tie recorded
    for _ in range(repeats):
        base = plain_decode(pair, ids, max_tokens)
        plain.append(base)
        for b in blocks:
            run = dflash2_decode(pair, ids, max_tokens, b, *drafting)
            spec[b].append(run)
            m = first_mismatch(base.tokens, run.tokens)
            if m is None or b in real:
                continue
            # every repeat's first parting until one is no near-tie: a tie never hides it
            where = parting(pair.model, ids, base.tokens, run.tokens, m)
            if not where["near_tie"]:
                real.add(b)
            mism[b] = m if mism[b] is None else min(mism[b], m)
            mismatches.append(
                {
                    "block": b,
                    "id": p.id,
                    "category": p.category,
                    "index": m,
                    "plain": base.tokens[m : m + 8],
                    "dflash2": run.tokens[m : m + 8],
                    **where,
                }
            )
    return {b: _row(p, ids, plain, spec[b], mism[b]) for b in blocks}


def _block_result(block: int, rows: list[dict]) -> dict:
    """One block's summary, per-category summaries and rows."""
    cats: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        cats[r["category"]].append(r)
    return {
        "block": block,
        "summary": _summary(rows),
        "per_category": {c: _summary(rs) for c, rs in cats.items()},
        "rows": rows,
    }
