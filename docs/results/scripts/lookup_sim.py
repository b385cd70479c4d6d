"""Round-by-round simulation of context lookup + drafter from teacher_forced_ok.json
(lookup_teacher_forced.py) -> smollm2-lookup-sim.json.
Usage: python lookup_sim.py [--input teacher_forced_ok.json] [--out smollm2-lookup-sim.json]"""

import argparse
import collections
import json

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--input", default="teacher_forced_ok.json")
ap.add_argument("--out", default="smollm2-lookup-sim.json")
args = ap.parse_args()
data = json.load(open(args.input))


def lookup(ctx, m, n):
    key = ctx[-m:]
    for i in range(len(ctx) - m - 1, -1, -1):
        if ctx[i : i + m] == key:
            return ctx[i + m : i + m + n]
    return None


def run(policy, B, maxlen):
    per = collections.defaultdict(lambda: [0, 0, 0])
    for s in data:
        t, start, ok = s["tokens"], s["start"], s["ok"]
        a = start
        while a - start < min(len(ok), maxlen):
            nd = sum(ok[a - start][: B - 1])
            prop = policy(t[: a + 1], B - 1)
            if prop is not None:
                n = 0
                for k, x in enumerate(prop):
                    if a + 1 + k < len(t) and t[a + 1 + k] == x:
                        n += 1
                    else:
                        break
                per[s["cat"]][2] += 1
            else:
                n = nd
            per[s["cat"]][0] += n + 1
            per[s["cat"]][1] += 1
            a += n + 1
    tot = [sum(v[i] for v in per.values()) for i in range(3)]
    return {
        "tau": round(tot[0] / tot[1], 3),
        "lookup_share": round(tot[2] / tot[1], 3),
        "rounds": tot[1],
        "per_category": {c: round(v[0] / v[1], 3) for c, v in sorted(per.items())},
    }


res = {
    "what": "Context lookup, simulated round by round on the 61 held-out greedy continuations (<= 256 tokens, data/smollm2/regen_heldout.jsonl) with the shipped drafter's teacher-forced drafts (stage 7): at each anchor the drafter's accepted count is read off its block drafted from the cached target features (exact for greedy up to float rounding), lookup's by comparing its proposal with the continuation; a round commits accepted + 1 and the next anchor follows. 'drafter' = lookup off; 'lookup N' = propose the continuation of the latest earlier occurrence of the last N tokens when there is one, else the drafter. The engine measured on 7 prompts x 64 tokens agrees (block 4: 1.557 -> 1.624 vs 1.523 -> 1.623 here on all 61).",
    "scripts": "docs/results/scripts/lookup_teacher_forced.py (drafts) + lookup_sim.py (rounds)",
    "runs": [],
}
for L in (64, 128, 256):
    for B in (4, 8):
        row = {"max_tokens": L, "block": B, "drafter": run(lambda c, n: None, B, L)}
        for m in (2, 3, 4):
            row[f"lookup {m}"] = run(lambda c, n, m=m: lookup(c, m, n), B, L)
        res["runs"].append(row)
json.dump(res, open(args.out, "w"), indent=1)
for r in res["runs"]:
    print(
        r["max_tokens"],
        r["block"],
        r["drafter"]["tau"],
        {k: (v["tau"], v["lookup_share"]) for k, v in r.items() if k.startswith("lookup")},
    )
