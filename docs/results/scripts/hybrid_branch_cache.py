"""The hybrid prompt cache's branch points, through the server: an agent's conversations that
open with the same long system prompt, on a random hybrid (Gated-DeltaNet) target.

For each arm a fresh server (its own prompt cache) answers N conversations one after the other
(the same ~1,500-token system prompt, a different question each), streamed, greedy; the time to
the first token and `cached_tokens` are read per conversation. Arms: branch points on (the
shipped rule) and off (BRANCH_MIN_TOKENS past any prompt: the cache as it was before),
alternated per repeat. Every answer is compared across arms (it must be the same).

The model is the test suite's tiny tokenizer (one token a character) with a random qwen3_5
target of `--hidden` / `--layers` (a GPU-free stand-in for Qwen3.5's shape of layers: attention
every second layer, Gated-DeltaNet between), and a random 2-layer DFlash2 drafter.

  python docs/results/scripts/hybrid_branch_cache.py OUT.json [--hidden 512 --layers 8 --repeats 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

import dflash2_mlx  # noqa: E402  (binds the optimized BLAS before MLX loads)
import openai  # noqa: E402
import tiny  # noqa: E402
from test_serve import make_tokenizer, running  # noqa: E402

from dflash2_mlx.api import Pair  # noqa: E402
from dflash2_mlx.profiles import device_key  # noqa: E402
from dflash2_mlx.engine import prompt_cache  # noqa: E402
from dflash2_mlx.serve import create_app  # noqa: E402

SYSTEM = (
    "You are a coding agent working in a user's repository. Read files before you edit "
    "them, run the tests after each change, and explain what you did in one short paragraph. "
) * 9
QUESTIONS = ["List the files", "Read the README", "Run the tests", "Fix the failing test"]


def conversation(client, question: str) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    t0 = time.perf_counter()
    first, text, usage = None, "", None
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    return {
        "question": question,
        "ttft_s": round((first or time.perf_counter()) - t0, 3),
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens,
        "text": text,
    }


def arm(pair, branch_points: bool) -> list[dict]:
    saved = prompt_cache.BRANCH_MIN_TOKENS
    if not branch_points:
        prompt_cache.BRANCH_MIN_TOKENS = 10**9
    try:
        app = create_app(pair, model_name="tiny", prompt_cache_mb=1024)
        with running(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
            return [conversation(client, q) for q in QUESTIONS]
    finally:
        prompt_cache.BRANCH_MIN_TOKENS = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    target = tiny.make_target("qwen3_5", hidden=args.hidden, layers=args.layers)
    drafter = tiny.make_drafter(2, block_size=4, layer_ids=(0, args.layers - 2), hidden=args.hidden)
    pair = Pair.from_models(target, make_tokenizer(), drafter)
    arm(pair, True)  # warm-up (compiles, allocations)
    runs = []
    for r in range(args.repeats):
        for on in (True, False) if r % 2 == 0 else (False, True):
            runs.append({"repeat": r, "branch_points": on, "conversations": arm(pair, on)})
    by = {on: [run for run in runs if run["branch_points"] is on] for on in (True, False)}
    texts = {on: [[c["text"] for c in run["conversations"]] for run in by[on]] for on in by}
    summary = {}
    for on, label in ((True, "on"), (False, "off")):
        per = [[c["ttft_s"] for c in run["conversations"]] for run in by[on]]
        summary[label] = {
            "ttft_s_by_conversation_mean": [round(sum(x) / len(x), 3) for x in zip(*per)],
            "cached_tokens_by_conversation": [
                c["cached_tokens"] for c in by[on][0]["conversations"]
            ],
        }
    result = {
        "what": __doc__.split("\n\n")[0],
        "command": " ".join(
            ["python", "docs/results/scripts/hybrid_branch_cache.py", *sys.argv[1:]]
        ),
        "model": {"family": "qwen3_5 (random)", "hidden": args.hidden, "layers": args.layers},
        "environment": {**dflash2_mlx.doctor(), "device": device_key()},
        "identical_across_arms": all(t == texts[True][0] for t in texts[True] + texts[False]),
        "summary": summary,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1), "identical:", result["identical_across_arms"])


if __name__ == "__main__":
    main()
