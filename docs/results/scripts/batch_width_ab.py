"""A/B of the batched engine's width rule: every measured width compared, rows of one length cut
too (the engine since 2026-12-05) vs only a ragged round's padding cut, among the proposals'
own widths (before). 8 held-out prompts x <= 128 tokens, at most 4 rows, greedy, arms
interleaved; block 8 with the default cost model (a machine without an autotune profile) and
block 4 with the profile's measured table (PROFILE.json); outputs must be identical.
Usage: python batch_width_ab.py PROFILE.json [ROUNDS]   (prints one JSON line)"""

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import json
import sys
import time

from dflash2_mlx import GenerationParams, SamplingParams
from dflash2_mlx import load_pair
from dflash2_mlx.batch_costs import width_costs
from dflash2_mlx.bench import chat_prompt_ids
from dflash2_mlx.engine import width
from dflash2_mlx.prompts import load_prompts


def padding_only_cap(self, proposals, fixed):
    """The rule before: only ragged rounds, only the proposals' own widths."""
    lengths = [len(p.drafts) for p in proposals]
    if len(proposals) < 2 or len(set(lengths)) < 2:
        return list(proposals)
    floor = max((d for d, f in zip(lengths, fixed) if f), default=0) + 1
    probs = [self.rate(p.source) for p in proposals]
    best, best_rate = floor, -1.0
    for w in sorted({d + 1 for d in lengths if d + 1 >= floor}):
        gain = sum(width.expected_committed(p, min(d, w - 1)) for d, p in zip(lengths, probs))
        if gain / max(self.cost(len(lengths), w), 1e-9) >= best_rate:
            best, best_rate = w, gain / max(self.cost(len(lengths), w), 1e-9)
    return [p if f else width.shorten(p, best - 1) for p, f in zip(proposals, fixed)]


pair = load_pair("smollm2-135m")
measured = width_costs(json.load(open(sys.argv[1])))
prompts = [chat_prompt_ids(pair.tokenizer, p.messages) for p in load_prompts("heldout")[:8]]
every_width = width.WidthRule.cap
tok_s, outputs = {}, {}
for rnd in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
    for block, cost in ((8, None), (4, measured)):
        params = GenerationParams(
            max_tokens=128, block_size=block, sampling=SamplingParams(temperature=0.0)
        )
        for arm in ("before", "now") if rnd % 2 == 0 else ("now", "before"):
            width.WidthRule.cap = padding_only_cap if arm == "before" else every_width
            out, n, start = [[] for _ in prompts], 0, time.perf_counter()
            for i, ev in pair.stream_batch(prompts, params, 4, cost):
                out[i] += ev.tokens
                n += len(ev.tokens)
            key = f"block {block}, {'default cost' if cost is None else 'measured'}: {arm}"
            tok_s.setdefault(key, []).append(round(n / (time.perf_counter() - start), 2))
            assert outputs.setdefault(block, out) == out, (block, arm)
width.WidthRule.cap = every_width
print(json.dumps({"tok_s": tok_s, "outputs_identical": True}))
