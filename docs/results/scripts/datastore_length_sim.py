"""Round-by-round replay of lookup > datastore > drafter on the 61 held-out greedy
continuations: how long should a datastore round be? Policies: up to 7 tokens (before); cut to
the drafter's block less the anchor; that, then on while the match is sure (two occurrences or
more, all agreeing: DatastoreMatch.sure); sure-only variants. Costs per round from
smollm2-verify-cost-by-context.json (a verify of the round's width, plus a draft pass for
drafter rounds) at 256 / 1,024 / 2,048 / 4,096 tokens of context, with the block this host's
profile picks there (4, 4, 2, 2). The drafter's accepted count at each anchor comes from
lookup_teacher_forced.py (block 8, cut to the block), the others' from comparing their
proposals with the continuation. Also: each datastore token's acceptance (given the ones
before it were accepted), sure or not. Not shipped: in the engine code lost 11-21 %
(datastore_length_ab.py).
Usage: python datastore_length_sim.py TEACHER_FORCED.json STORE.npz COSTS.json OUT.json"""

import collections
import json
import sys

from dflash2_mlx.engine.datastore import DEFAULT_DATASTORE_LENGTH, Datastore
from replay_rows import agreed, model_free_rows

BLOCKS = {"256": 4, "1024": 4, "2048": 2, "4096": 2}
LOOKUP_LENGTH = 11  # the profile's lookup block 12, less the anchor
data = json.load(open(sys.argv[1]))
store = Datastore.load(sys.argv[2])
costs = json.load(open(sys.argv[3]))["by_context"]
rows_of = model_free_rows(data, store, LOOKUP_LENGTH, DEFAULT_DATASTORE_LENGTH)


def verify_ms(context: str, width: int) -> float:
    ms = {int(k): v for k, v in costs[context]["verify_ms"].items()}
    if width in ms:
        return ms[width]
    lo = max(w for w in ms if w < width)
    hi = min((w for w in ms if w > width), default=None)
    if hi is None:  # past the widest: along the last two
        hi, lo = lo, max(w for w in ms if w < lo)
    return ms[lo] + (ms[hi] - ms[lo]) * (width - lo) / (hi - lo)


def cut(match, policy: str, block: int) -> list[int]:
    toks, sure = match.tokens, match.sure
    if policy == "up to 7":
        return toks
    n = {"block": block - 1, "block, then sure": block - 1, "1, then sure": 1}.get(policy, 0)
    n = min(n, len(toks))
    if policy != "block":
        while n < len(toks) and sure[n]:
            n += 1
    return toks[:n]


def replay(context: str, policy: str) -> dict:
    block = BLOCKS[context]
    per = collections.defaultdict(lambda: [0, 0.0])  # category -> [tokens, ms]
    store_rounds = 0
    for s, rows in zip(data, rows_of):
        t, start, ok = s["tokens"], s["start"], s["ok"]
        a = start
        while a - start < len(ok):
            look, m = rows[a - start]
            p = cut(m, policy, block) if m is not None and m.share >= store.min_share else []
            if look:
                n, ms = agreed(t, a, look), verify_ms(context, len(look) + 1)
            elif p:
                n, ms = agreed(t, a, p), verify_ms(context, len(p) + 1)
                store_rounds += 1
            else:
                drafts = ok[a - start][: block - 1]
                n = next((i for i, x in enumerate(drafts) if not x), len(drafts))
                ms = verify_ms(context, block) + costs[context]["draft_ms"][str(block)]
            per[s["cat"]][0] += n + 1
            per[s["cat"]][1] += ms
            a += n + 1
    tokens, ms = (sum(v[i] for v in per.values()) for i in (0, 1))
    return {
        "tokens_per_s": round(1000 * tokens / ms, 4),
        "datastore_rounds": store_rounds,
        "per_category": {c: round(1000 * v[0] / v[1], 4) for c, v in sorted(per.items())},
    }


def acceptance() -> dict:
    """Each proposed datastore token's acceptance given the ones before it were accepted."""
    counts = collections.defaultdict(lambda: [0, 0])
    for s, rows in zip(data, rows_of):
        t, start = s["tokens"], s["start"]
        for a in range(start, start + len(s["ok"])):
            look, m = rows[a - start]
            if look or m is None or m.share < store.min_share:
                continue
            for k, (tok, sure) in enumerate(zip(m.tokens, m.sure)):
                if a + 1 + k >= len(t):
                    break
                c = counts[
                    f"position {min(k, 3) + 1}{'+' if k >= 3 else ''}, "
                    + ("sure" if sure else "not sure")
                ]
                c[1] += 1
                if t[a + 1 + k] != tok:
                    break
                c[0] += 1
    return {
        k: {"accepted": a, "proposed": n, "rate": round(a / n, 3)}
        for k, (a, n) in sorted(counts.items())
    }


policies = ["up to 7", "block", "block, then sure", "1, then sure", "sure only"]
out = {}
for context in BLOCKS:
    runs = {p: replay(context, p) for p in policies}
    base = runs["up to 7"]["tokens_per_s"]
    for p, r in runs.items():
        r["vs_up_to_7"] = round(r["tokens_per_s"] / base, 4)
        print(context, p, r["vs_up_to_7"], r["datastore_rounds"], flush=True)
    out[context] = {"block": BLOCKS[context], "policies": runs}
record = {
    "what": "Replay of lookup > datastore > drafter on the 61 held-out greedy continuations "
    "(256 tokens): a datastore round's length by policy; modelled tokens/s from the measured "
    "verify and draft costs at each context, with the profile's block there.",
    "command": "python docs/results/scripts/datastore_length_sim.py TF.json STORE.npz "
    "docs/results/smollm2-verify-cost-by-context.json OUT.json (TF from lookup_teacher_forced.py, "
    "stage 24)",
    "min_share": store.min_share,
    "lookup_length": LOOKUP_LENGTH,
    "acceptance": acceptance(),
    "by_context": out,
}
json.dump(record, open(sys.argv[4], "w"), indent=1)
print(json.dumps(record["acceptance"], indent=1))
