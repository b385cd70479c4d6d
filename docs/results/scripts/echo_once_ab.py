"""A/B: an echo+logprobs request with max_tokens 1 — scoring pass + generation (before) vs the
generation's own prefill scoring (now), on the embedded pair, arms interleaved."""
import json, sys, time
import dflash2_mlx
from dflash2_mlx.embedded import ensure_smollm2
from dflash2_mlx.api import load_pair
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.engine.scoring import PromptScoring
from dflash2_mlx.prompts import load_prompts
pair = load_pair(str(ensure_smollm2()))
tok = pair.tokenizer
texts = [" ".join(m["content"] for m in p.messages) for p in load_prompts("heldout")][:40]
doc = " ".join(texts)
prompts = [tok.encode(doc)[i * 97 : i * 97 + n] for i, n in enumerate([256, 512, 1024])]
res = {"before": [], "now": []}
for rep in range(3):
    for ids in prompts:
        t = time.process_time(); w = time.perf_counter()
        s = PromptScoring(pair.decoder.target, ids, 1).run()
        out = list(pair.decoder.stream(ids, GenerationParams(max_tokens=1)))
        res["before"].append((len(ids), time.process_time() - t, time.perf_counter() - w))
        t = time.process_time(); w = time.perf_counter()
        ev = list(pair.decoder.stream(ids, GenerationParams(max_tokens=1, prompt_logprobs=1)))
        res["now"].append((len(ids), time.process_time() - t, time.perf_counter() - w))
        assert ev[0].tokens == out[0].tokens
        diff = max(abs(a.logprob - b.logprob) for a, b in zip(s.result if hasattr(s, "result") else s, ev[0].prompt_logprobs))
        print(len(ids), res["before"][-1][1:], res["now"][-1][1:], "max |dlogprob|", diff, flush=True)
cpu = {k: sum(x[1] for x in v) for k, v in res.items()}
print("cpu before/now", cpu, cpu["before"] / cpu["now"])
json.dump({"runs": res, "cpu_ratio": cpu["before"] / cpu["now"]}, open(sys.argv[1], "w"), indent=1)
