"""The library's batched loop on the 8 serve_concurrency.py prompts (greedy, <= 256 tokens, all
queued at once, up to MAX_BATCH together): tokens/s over the run, and per batch size the rounds,
tokens a round, a round's wall, draft and verify ms, and the proposals' sources
(docs/results/smollm2-blas-split-engine-ab.json).

    python docs/results/scripts/batch_loop_rounds.py [MAX_BATCH]
"""

import collections
import sys
import time

import dflash2_mlx  # noqa: F401  (binds the BLAS before MLX loads)
from dflash2_mlx import load_pair
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.text import chat_prompt_ids

NAMES = ["chat-005", "instructions-005", "code-005", "math-005", "stories-005"]
NAMES += ["summaries-005", "multi-turn-005", "chat-015"]


def main(max_batch: int) -> None:
    pair = load_pair("smollm2-135m", offline=True)
    held = {p.id: p for p in load_prompts("heldout")}
    prompts = [chat_prompt_ids(pair.tokenizer, held[n].messages) for n in NAMES]
    pair.generate_batch(prompts[:2], GenerationParams(max_tokens=16), max_batch=2)  # warm
    loop = pair.batch(max_batch=max_batch)
    for p in prompts:
        loop.add(p, GenerationParams(max_tokens=256))
    stats: dict = collections.defaultdict(collections.Counter)
    start, total = time.perf_counter(), 0
    while loop.busy:
        t0 = time.perf_counter()
        events = [e for _, e in loop.step()]
        wall = (time.perf_counter() - t0) * 1000
        total += sum(len(e.tokens) for e in events)
        rounds = [e for e in events if not e.prefill]
        s = stats[rounds[0].batch_size] if rounds else stats["prefill"]
        s["rounds"] += 1
        s["wall_ms"] += wall
        for e in rounds:
            s["tokens"] += len(e.tokens)
            s[f"source {e.source}"] += 1
        if rounds:
            s["draft_ms"] += rounds[0].draft_ms
            s["verify_ms"] += rounds[0].verify_ms
    seconds = time.perf_counter() - start
    print(f"max_batch {max_batch}: {total} tokens in {seconds:.2f}s = {total / seconds:.1f} tok/s")
    for size, s in sorted(stats.items(), key=lambda kv: str(kv[0])):
        n = s["rounds"]
        per = {k: round(v / n, 2) for k, v in s.items() if k != "rounds"}
        print(f"batch {size}: {n} steps, per step {per}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
