"""How long a joining request's prefill stalls a running stream (engine/batch.py `prefill_step`),
embedded SmolLM2 pair, greedy. One stream runs (a held-out chat prompt; its stop tokens off so
it outlasts every prefill); after a few of its rounds a request with a ~2,000-token prompt (real
text) joins. Per arm: the longest gap between the running stream's token events from the
joiner's arrival to its first token (and their median), the stream's median gap before the
joiner arrived, the joiner's time to first token and the stream's rounds meanwhile. Arms:
`whole` = a prefill_step larger than the prompt (the whole prefill in one step, as before
prefills were interleaved), then prefill_step 512 (the decoder's prefill_chunk: one chunk per
step), 256, 128, 64. Both requests' tokens are checked against their runs alone.
Usage: nice -n 10 python join_stall.py OUT.json [--prompt-tokens N] [--steps 512,256,128,64]
       [--repeats N]"""

import argparse
import json
import os
import statistics
import time

import dflash2_mlx as d2  # binds the optimized BLAS before MLX loads

from dflash2_mlx import bench_env
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.engine.batch import BatchDecoder
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.registry import EMBEDDED_DRAFTER
from dflash2_mlx.text import chat_prompt_ids
from prefill_scaling import prompt_ids  # real text: the repository's docs, repeated

WARM_ROUNDS = 6  # the running stream's rounds before the joiner arrives
AFTER_STEPS = 3  # steps run after the joiner's first token


def arm(pair, run_ids, join_ids, step: int) -> dict:
    batch = BatchDecoder(pair.decoder, max_batch=4, prefill_step=step)
    run = batch.add(run_ids, d2.GenerationParams(max_tokens=4096))
    joiner = None
    times, tokens = [], {run: [], "join": []}
    added = first = None
    after = 0
    while after < AFTER_STEPS:
        events = batch.step()
        now = time.perf_counter()
        for rid, ev in events:
            if rid == run:
                if not ev.prefill:
                    times.append(now)
                tokens[run].extend(ev.tokens)
                assert ev.finish_reason is None, "the running stream ended"
            else:
                tokens["join"].extend(ev.tokens)
                first = first or now
        if first is not None:
            after += 1
        if joiner is None and len(times) == WARM_ROUNDS:
            added = time.perf_counter()
            joiner = batch.add(join_ids, d2.GenerationParams(max_tokens=64))
    batch.cancel(run)
    batch.cancel(joiner)
    before = [b - a for a, b in zip(times, times[1:]) if b <= added]
    during = [b - a for a, b in zip(times, times[1:]) if b > added and a < first]
    return {
        "prefill_step": step,
        "longest_gap_s": round(max(during), 3),
        "median_gap_during_s": round(statistics.median(during), 3),
        "median_gap_before_s": round(statistics.median(before), 3),
        "joiner_ttft_s": round(first - added, 2),
        "running_rounds_during_prefill": sum(1 for t in times if added < t < first),
        "tokens": (tokens[run], tokens["join"]),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--steps", default="512,256,128,64")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    pair = d2.load_pair(ensure_smollm2(), EMBEDDED_DRAFTER)
    chunk = pair.decoder.prefill_chunk
    messages = load_prompts("heldout")[0].messages
    run_ids = chat_prompt_ids(pair.tokenizer, messages)
    join_ids = prompt_ids(pair.tokenizer, args.prompt_tokens)
    arm(pair, run_ids, join_ids[:300], chunk)  # warm-up: buffers, kernels
    steps = [10**9] + [int(s) for s in args.steps.split(",")]
    rows = []
    for rep in range(args.repeats):  # odd repeats run the arms in reverse (a drifting load)
        for step in steps if rep % 2 == 0 else steps[::-1]:
            row = arm(pair, run_ids, join_ids, step)
            row["arm"] = "whole" if step == 10**9 else f"prefill_step={step}"
            print(json.dumps({k: v for k, v in row.items() if k != "tokens"}), flush=True)
            rows.append(row)
    longest = max(len(r["tokens"][0]) for r in rows)
    want_run = pair.decoder.generate(run_ids, d2.GenerationParams(max_tokens=longest))
    want_join = pair.decoder.generate(join_ids, d2.GenerationParams(max_tokens=64))
    for r in rows:
        got_run, got_join = r.pop("tokens")
        r["outputs_equal_alone"] = (
            got_run == want_run[: len(got_run)] and got_join == want_join[: len(got_join)]
        )
    summary = {}
    for r in rows:
        s = summary.setdefault(r["arm"], {"longest_gap_s": [], "joiner_ttft_s": []})
        s["longest_gap_s"].append(r["longest_gap_s"])
        s["joiner_ttft_s"].append(r["joiner_ttft_s"])
    for s in summary.values():
        for k in ("longest_gap_s", "joiner_ttft_s"):
            s["mean_" + k] = round(statistics.mean(s[k]), 2)
    env = bench_env.environment()
    res = {
        "what": "A running stream's longest gap between token events while a request with a "
        f"{len(join_ids)}-token prompt joins it (BatchDecoder, max_batch 4), embedded "
        "SmolLM2-135M (fp32) + shipped drafter, greedy, prefill_chunk "
        f"{chunk}. whole = the joiner's prefill in one step (the behaviour before prefills "
        "were interleaved); prefill_step=N = at most N prompt tokens per step between the "
        "running stream's rounds. One process; each repeat runs every arm once, odd repeats "
        "in reverse order.",
        "script": "docs/results/scripts/join_stall.py",
        "machine": {k: env[k] for k in ("chip", "blas", "blas_threads", "mlx", "device")},
        "summary": summary,
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
