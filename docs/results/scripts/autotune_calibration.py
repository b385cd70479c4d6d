"""How much does the autotuner's short calibration (7 prompts x 128 tokens) cost in block choice?

Records every round of greedy dflash2 on all 61 held-out prompts at block 8, lookup block 32, 256
tokens (as autotune.calibrate runs them), takes the drafter rounds' per-position acceptance as the
truth, and draws 400 random 7-prompt subsets cut at 128 tokens: the raw estimate, and estimates
that shrink each position toward the one before (m pseudo-rounds), against the truth — the error
in E[tokens per round] and the throughput lost by the block each one picks under measured CPU
costs (two autotune profiles) and two made-up GPU-like cost curves.

    python docs/results/scripts/autotune_calibration.py ROUNDS.json PROFILE_A.json PROFILE_B.json OUT.json
(ROUNDS.json is recorded first when missing; the profiles: `dflash2 bench --autotune --json`.)
"""

import dflash2_mlx  # noqa: F401  (binds the BLAS before mlx)

import json
import random
import statistics
import sys
from pathlib import Path

from dflash2_mlx import autotune as A

BENCH7 = [
    f"{c}-005"
    for c in ("chat", "instructions", "code", "math", "stories", "summaries", "multi-turn")
]


def record(path: Path) -> None:
    from dflash2_mlx import load_pair
    from dflash2_mlx.engine.generation import GenerationParams
    from dflash2_mlx.prompts import load_prompts
    from dflash2_mlx.text import chat_prompt_ids

    pair = load_pair("smollm2-135m")
    params = GenerationParams(max_tokens=256, block_size=8, lookup_block=32)
    out = {}
    for p in load_prompts("heldout"):
        rows, n = [], 0
        for ev in pair.stream(chat_prompt_ids(pair.tokenizer, p.messages), params):
            if not ev.prefill:
                rows.append([ev.source, ev.drafted, ev.accepted, n, ev.finish_reason is not None])
            n += len(ev.tokens)
        out[p.id] = rows
    path.write_text(json.dumps(out))


def drafter_rounds(data: dict, pids, limit: int) -> list[tuple[int, int]]:
    return [
        (d, a)
        for pid in pids
        for src, d, a, n, last in data[pid]
        if src == "drafter" and d and not last and n < limit
    ]


def shrunk(rounds, m: int, positions: int = 7) -> list[float]:
    out = []
    for k in range(1, positions + 1):
        reached = [a for d, a in rounds if d >= k and a >= k - 1]
        acc = sum(1 for a in reached if a >= k)
        prior = out[-1] if out else 0.0
        if k == 1 or m == 0:
            out.append(acc / len(reached) if reached else prior)
        else:
            out.append((acc + m * prior) / (len(reached) + m))
    return out


def main() -> None:
    rounds_path, prof_a, prof_b, out_path = map(Path, sys.argv[1:5])
    if not rounds_path.exists():
        record(rounds_path)
    data = json.loads(rounds_path.read_text())
    costs = {}
    for p in (prof_a, prof_b):
        prof = json.loads(p.read_text())
        at = prof["autotune"]
        name = f"{prof['environment']['blas_core']} ({p.name})"
        costs[name] = (
            {int(k): v for k, v in at["verify"]["ms"].items()},
            {int(k): v for k, v in at["draft"]["ms"].items()},
        )
    draft = {b: 3.0 + 0.1 * b for b in range(1, 9)}
    costs["flat: verify +3 % a token"] = (
        {b: 20.0 * (1 + 0.03 * (b - 1)) for b in range(1, 9)},
        draft,
    )
    costs["steep: verify +15 % a token"] = (
        {b: 20.0 * (1 + 0.15 * (b - 1)) for b in range(1, 9)},
        draft,
    )

    truth, counts = A.acceptance_probs(drafter_rounds(data, data, 10**9), 7)

    def tps(p, c, b):
        v, d = c
        return 1000.0 * A.expected_tokens(p, b) / (v[b] + (d[b] if b > 1 else 0.0))

    rng = random.Random(0)
    trials = [rng.sample(sorted(data), 7) for _ in range(400)]
    estimators = []
    for m in (0, 4, 16, 32):
        errs, regret = [], {n: [] for n in costs}
        for pids in trials:
            p = shrunk(drafter_rounds(data, pids, 128 - 8), m)
            errs.append(
                statistics.mean(
                    abs(A.expected_tokens(p, b) - A.expected_tokens(truth, b)) for b in range(2, 9)
                )
            )
            for n, c in costs.items():
                best = max(range(1, 9), key=lambda b: tps(truth, c, b))
                chosen = max(range(1, 9), key=lambda b: (tps(p, c, b), -b))
                regret[n].append(1 - tps(truth, c, chosen) / tps(truth, c, best))
        estimators.append(
            {
                "shrink_pseudo_rounds": m,
                "mean_abs_error_expected_tokens_b2_8": round(statistics.mean(errs), 4),
                "mean_throughput_lost_pct": {
                    n: round(100 * statistics.mean(r), 3) for n, r in regret.items()
                },
            }
        )
    bench7 = A.acceptance_probs(drafter_rounds(data, BENCH7, 128 - 8), 7)
    result = {
        "script": "docs/results/scripts/autotune_calibration.py",
        "truth": {
            "what": "drafter rounds, 61 held-out prompts x 256 tokens, block 8, greedy",
            "position_probs": [round(p, 4) for p in truth],
            "position_rounds": counts,
        },
        "bench7_calibration_raw": {
            "position_probs": [round(p, 4) for p in bench7[0]],
            "position_rounds": bench7[1],
        },
        "costs_ms": {n: {"verify": v, "draft": d} for n, (v, d) in costs.items()},
        "truth_tok_s_by_block": {
            n: {b: round(tps(truth, c, b), 2) for b in range(1, 9)} for n, c in costs.items()
        },
        "trials": len(trials),
        "estimators": estimators,
    }
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
