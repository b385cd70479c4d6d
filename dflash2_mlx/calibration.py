"""The autotuner's calibration runs: per-position acceptance of the drafter, greedy or sampled.

`calibrate` runs dflash2 over prompts at one block and counts, per drafter round, the drafts
proposed and accepted; `acceptance_probs` turns them into p_k = P(draft k accepted | drafts
1..k-1 accepted), which autotune.choose_block prices against the measured costs.

Sampled rounds accept less than greedy ones (a draft is kept with probability min(1, p/q),
and at a higher temperature p spreads), so the block that pays at T=0 may not at T=1: with
SmolLM2-135M on a Zen 4 EPYC (docs/results/smollm2-sampled-block.json), at T=1.0 block 2 ran as
fast as block 4 or faster (1.09x vs 0.98x plain decoding in one run, 1.03x vs 1.03x in
another), while at T=0.7 block 4 stayed best (1.27x). So the autotuner calibrates at SAMPLED_TEMPERATURES too
and keeps, per temperature, the block those rounds make best (`falling_blocks`).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Sequence

from .errors import ParameterError

# Temperatures the autotuner calibrates sampled rounds at; a request at or above one of them
# (and below the next) uses its block (settings.block_for_temperature).
SAMPLED_TEMPERATURES = (0.7, 1.0)
# Fewer drafter rounds than this say too little to choose a block by: greedy, the autotuner
# stores nothing; sampled, that temperature is left out of the profile.
MIN_ROUNDS = 20


def acceptance_probs(
    rounds: Iterable[tuple[int, int]], max_drafted: int
) -> tuple[list[float], list[int]]:
    """p_k for k = 1..max_drafted from (drafted, accepted) per round: the share of rounds that
    accepted draft k among those that drafted k and accepted drafts 1..k-1. Returns (p, the
    number of rounds behind each p_k); p_k = 0 where no round reached k."""
    rounds = list(rounds)
    probs, counts = [], []
    for k in range(1, max_drafted + 1):
        reached = [a for d, a in rounds if d >= k and a >= k - 1]
        counts.append(len(reached))
        probs.append(sum(1 for a in reached if a >= k) / len(reached) if reached else 0.0)
    return probs, counts


def calibrate(
    pair,
    prompts,
    block: int,
    *,
    lookup_block: int,
    max_tokens: int = 128,
    thinking: bool | None = None,
    temperature: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """dflash2 runs at `block` (lookup rounds up to `lookup_block`) over `prompts`, greedy or
    at `temperature` (seed 0): (drafted, accepted) of every full round (the last round of
    each generation is left out: it may be cut by max tokens or a stop), drafter rounds for
    the per-position acceptance, lookup rounds apart (as [drafted, accepted, rounds] counts),
    and the share of drafting rounds that ran the drafter."""
    from .engine.events import tau
    from .engine.generation import GenerationParams
    from .sampling import SamplingParams
    from .text import chat_prompt_ids

    rounds: list[tuple[int, int]] = []
    looked_up: Counter = Counter()
    sampling = SamplingParams(temperature=temperature, seed=0 if temperature else None)
    params = GenerationParams(  # every drafter round drafts: what the block does (no back-off)
        max_tokens=max_tokens,
        block_size=block,
        lookup_block=lookup_block,
        sampling=sampling,
        backoff=False,
    )
    for i, p in enumerate(prompts):
        ids = chat_prompt_ids(pair.tokenizer, p.messages, thinking=thinking)
        for ev in pair.stream(ids, params):
            if not ev.prefill and ev.finish_reason is None and ev.drafted:
                if ev.source == "drafter":
                    rounds.append((ev.drafted, ev.accepted))
                elif ev.source != "datastore":  # its rounds have their own, shorter cap
                    looked_up[(ev.drafted, ev.accepted)] += 1
        if progress is not None:
            progress(i + 1, len(prompts))
    probs, counts = acceptance_probs(rounds, block - 1)
    n_lookup = sum(looked_up.values())
    lookup_accepted = sum(a * n for (_, a), n in looked_up.items())
    total = len(rounds) + n_lookup
    return {
        "block": block,
        "temperature": temperature,
        "lookup_block": lookup_block,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "rounds": len(rounds),
        "tau": round(tau(sum(a for _, a in rounds), len(rounds)), 4),
        "drafter_share": round(len(rounds) / total, 4) if total else 1.0,
        "position_probs": [round(p, 4) for p in probs],
        "position_rounds": counts,
        "lookup_rounds": n_lookup,
        "lookup_tau": round(tau(lookup_accepted, n_lookup), 4),
        "lookup_counts": [[d, a, n] for (d, a), n in sorted(looked_up.items())],
    }


def falling_blocks(choices: Sequence[tuple[float, int]], first: int) -> list[list]:
    """[[temperature, block], ...]: the blocks chosen at ascending temperatures, listed where
    they fall below the one before (`first`: the greedy choice). A block never rises with the
    temperature (a hotter distribution accepts no more): what noise would make rise is held."""
    out, current = [], first
    for temperature, block in sorted(choices):
        if block < current:
            out.append([float(temperature), int(block)])
            current = block
    return out


def check_rounds(calib: dict, prompts: int, max_tokens: int) -> None:
    """Too few greedy drafter rounds to choose a block by: refused before anything is stored
    (a profile chosen from one round could turn drafting off for every later chat)."""
    if calib["rounds"] < MIN_ROUNDS:
        raise ParameterError(
            f"autotune: the calibration ran {calib['rounds']} drafter rounds ({prompts} prompts "
            f"x {max_tokens} tokens), fewer than the {MIN_ROUNDS} a block is chosen by; "
            "nothing was stored: give it more prompts or tokens (bench: --limit, --max-tokens; "
            "its defaults are enough)"
        )
