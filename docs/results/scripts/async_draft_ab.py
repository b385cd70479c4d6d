"""A/B of a drafter round: the verify graph built while the drafter's pass runs (B, the engine
since 2026-12-05) vs the drafts read as soon as they are proposed (A, before). The 7 held-out
bench prompts x <= 128 tokens, greedy, block 4, arms interleaved per prompt (ABAB / BABA),
decode tok/s after the prefill; every output must equal the first one of its prompt.
Usage: python async_draft_ab.py [ROUNDS]   (prints one JSON line)"""

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import json
import statistics
import sys
import time

from dflash2_mlx import GenerationParams, SamplingParams
from dflash2_mlx import load_pair
from dflash2_mlx.bench import chat_prompt_ids, select_prompts
from dflash2_mlx.engine import proposal
from dflash2_mlx.prompts import load_prompts

pair = load_pair("smollm2-135m")
overlapped = proposal.Proposal.from_drafter.__func__


def read_at_once(cls, block):
    return cls(block.tokens.tolist(), block.q, block.candidates, "drafter")


params = GenerationParams(max_tokens=128, block_size=4, sampling=SamplingParams(temperature=0.0))
tok_s, outputs = {"A": [], "B": []}, {}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for p in select_prompts(load_prompts("heldout"), 7):
        ids = chat_prompt_ids(pair.tokenizer, p.messages)
        for arm in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
            proposal.Proposal.from_drafter = classmethod(read_at_once if arm == "A" else overlapped)
            tokens, start = [], None
            for ev in pair.stream(ids, params):
                start = time.perf_counter() if ev.prefill else start
                tokens += ev.tokens
            tok_s[arm].append((len(tokens) - 1) / (time.perf_counter() - start))
            assert outputs.setdefault(p.id, tokens) == tokens, (p.id, arm)
proposal.Proposal.from_drafter = classmethod(overlapped)
ratios = [b / a for a, b in zip(tok_s["A"], tok_s["B"])]
print(
    json.dumps(
        {
            "A_tok_s": [round(x, 2) for x in tok_s["A"]],
            "B_tok_s": [round(x, 2) for x in tok_s["B"]],
            "ratio_median": round(statistics.median(ratios), 4),
            "ratio_total": round(sum(tok_s["B"]) / sum(tok_s["A"]), 4),
        }
    )
)
