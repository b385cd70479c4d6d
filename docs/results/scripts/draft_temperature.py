"""Sampled acceptance vs the temperature of the drafter's path walk: the walk's q =
softmax(scores / (factor x the request's temperature)) (any q keeps the output exact; the
engine uses factor 1). Drafter rounds only (lookup and datastore off), block 8, the first N
held-out bench prompts x <= 128 tokens, seeds 0-2; per-position acceptance and tau.
The factor is set on this pair's own selector instance (no class is patched). Usage:
  python draft_temperature.py OUT.json TEMPS FACTORS [N]   e.g. 1.0 1.0,0.7,0.5,1.4 7"""

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import json
import sys

from dflash2_mlx import GenerationParams, SamplingParams
from dflash2_mlx import load_pair
from dflash2_mlx.bench import chat_prompt_ids, select_prompts
from dflash2_mlx.calibration import acceptance_probs
from dflash2_mlx.prompts import load_prompts

out_path = sys.argv[1]
temps = [float(x) for x in sys.argv[2].split(",")]
factors = [float(x) for x in sys.argv[3].split(",")]
pair = load_pair("smollm2-135m", lookup=0, datastore=False)
prompts = select_prompts(load_prompts("heldout"), int(sys.argv[4]) if len(sys.argv) > 4 else 7)
selector = pair.drafter.candidate_selector
select = selector.select
rows = []
for t in temps:
    for f in factors:

        def scaled(h, logits, anchor, temperature=0.0, key=None, vocab=None, f=f):
            return select(h, logits, anchor, temperature * f, key, vocab)

        selector.select = scaled
        rounds = []
        for seed in (0, 1, 2):
            sp = SamplingParams(temperature=t, seed=seed)
            params = GenerationParams(max_tokens=128, block_size=8, sampling=sp)
            for p in prompts:
                for ev in pair.stream(chat_prompt_ids(pair.tokenizer, p.messages), params):
                    if not ev.prefill and ev.finish_reason is None and ev.drafted:
                        rounds.append((ev.drafted, ev.accepted))
        probs, counts = acceptance_probs(rounds, 7)
        tau = sum(a + 1 for _, a in rounds) / len(rounds)
        row = {"temperature": t, "factor": f, "rounds": len(rounds), "tau": round(tau, 4)}
        row.update(probs=[round(p, 3) for p in probs], counts=counts)
        rows.append(row)
        print(json.dumps(row), flush=True)
with open(out_path, "w") as out:
    json.dump(rows, out, indent=1)
