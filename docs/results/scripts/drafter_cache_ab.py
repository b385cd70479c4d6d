"""A/B: the drafter's context cache written in place (now) vs the whole context K/V copied
every round (before: concatenated twice a layer), on the embedded pair, greedy, arms
interleaved: a short prompt with a long reply and a long document with a 512-token reply.
Outputs compared token for token; tokens/s per arm and per 512-token window.

Usage: python drafter_cache_ab.py OUT.json"""

import json
import sys
import time

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)
import mlx.core as mx
from dflash2_mlx.bench_env import environment
from dflash2_mlx import load_pair
from dflash2_mlx.drafter.attention import ContextCache
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.prompts import load_prompts


class CopiedContextCache(ContextCache):
    """The cache before: every round concatenates the whole context with the new rows."""

    def append(self, keys, values):
        if self.keys is not None:
            keys = mx.concatenate([self.keys, keys], axis=2)
            values = mx.concatenate([self.values, values], axis=2)
        self.buffers, self.length = (keys, values), keys.shape[2]
        return keys, values

    def with_block(self, keys, values):
        return (
            mx.concatenate([self.keys, keys], axis=2),
            mx.concatenate([self.values, values], axis=2),
        )


def run(pair, ids, max_tokens):
    """Committed tokens, wall and CPU seconds, and the wall time each 512-token window ended."""
    tokens, marks, start, cpu = [], [], time.perf_counter(), time.process_time()
    for event in pair.decoder.stream(ids, GenerationParams(max_tokens=max_tokens)):
        tokens += event.tokens
        while len(tokens) >= 512 * (len(marks) + 1):
            marks.append(time.perf_counter() - start)
    return tokens, time.perf_counter() - start, time.process_time() - cpu, marks


def main(out_path: str) -> None:
    pair = load_pair(str(ensure_smollm2()))
    drafter = pair.decoder.drafter
    made = {"now": ContextCache, "before": CopiedContextCache}
    tok = pair.tokenizer
    story = tok.apply_chat_template(
        [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}],
        add_generation_prompt=True,
    )
    texts = [" ".join(m["content"] for m in p.messages) for p in load_prompts("heldout")]
    doc = tok.encode("Summarize this:\n" + " ".join(texts))[:3000]
    cases = {"story-4096": (story, 4096), "document-3000+512": (doc, 512)}
    res = {case: {arm: [] for arm in made} for case in cases}
    for _ in range(3):
        for case, (ids, n) in cases.items():
            outs = {}
            for arm, cls in made.items():
                drafter.make_cache = lambda cls=cls: [
                    cls(drafter.config.layer_window(i)) for i in range(len(drafter.layers))
                ]
                outs[arm], wall, cpu, marks = run(pair, ids, n)
                row = {"tokens": len(outs[arm]), "s": wall, "cpu_s": cpu, "windows_s": marks}
                res[case][arm].append(row)
                print(case, arm, len(outs[arm]), "%.1f tok/s" % (len(outs[arm]) / wall), flush=True)
            assert outs["now"] == outs["before"], case
    summary = {}
    for case, arms in res.items():
        rate = {a: sum(r["tokens"] for r in v) / sum(r["s"] for r in v) for a, v in arms.items()}
        cpu = {a: sum(r["cpu_s"] for r in v) for a, v in arms.items()}
        summary[case] = {
            "tok_s": rate,
            "now_over_before": rate["now"] / rate["before"],
            "cpu_s": cpu,
            "cpu_before_over_now": cpu["before"] / cpu["now"],
        }
    print(json.dumps(summary, indent=1))
    machine = environment()
    with open(out_path, "w") as f:
        json.dump({"machine": machine, "summary": summary, "runs": res}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
