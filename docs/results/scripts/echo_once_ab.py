"""A/B: a completion's echo with logprobs and max_tokens 1 (lm-evaluation-harness's
loglikelihood request): a scoring pass then the generation (before) vs the generation's prefill
scoring the prompt (GenerationParams.prompt_logprobs, now), on the embedded pair, arms
interleaved; CPU and wall time per run, outputs and log-probabilities compared.

Usage: python echo_once_ab.py OUT.json"""

import json
import sys
import time

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)
from dflash2_mlx import load_pair
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.engine.scoring import PromptScoring
from dflash2_mlx.prompts import load_prompts


def timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def main(out_path: str) -> None:
    pair = load_pair(str(ensure_smollm2()))
    texts = [" ".join(m["content"] for m in p.messages) for p in load_prompts("heldout")][:40]
    doc = pair.tokenizer.encode(" ".join(texts))
    prompts = [doc[i * 97 : i * 97 + n] for i, n in enumerate([256, 512, 1024])]
    res = {"before": [], "now": []}
    for _ in range(3):
        for ids in prompts:

            def before(ids=ids):
                scored = PromptScoring(pair.decoder.target, ids, 1).run()
                return scored, list(pair.decoder.stream(ids, GenerationParams(max_tokens=1)))

            def now(ids=ids):
                params = GenerationParams(max_tokens=1, prompt_logprobs=1)
                return list(pair.decoder.stream(ids, params))

            (scored, plain), cpu, wall = timed(before)
            res["before"].append((len(ids), cpu, wall))
            events, cpu, wall = timed(now)
            res["now"].append((len(ids), cpu, wall))
            assert events[0].tokens == plain[0].tokens
            diff = max(
                abs(a.logprob - b.logprob) for a, b in zip(scored, events[0].prompt_logprobs)
            )
            print(len(ids), res["before"][-1][1:], res["now"][-1][1:], "max |dlogprob|", diff)
    cpu = {k: sum(x[1] for x in v) for k, v in res.items()}
    print("cpu before/now", cpu, cpu["before"] / cpu["now"])
    with open(out_path, "w") as f:
        json.dump({"runs": res, "cpu_ratio": cpu["before"] / cpu["now"]}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
