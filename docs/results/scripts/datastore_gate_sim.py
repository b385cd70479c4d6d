"""Round-by-round replay of lookup > datastore > drafter on the 61 held-out greedy
continuations, for datastore keys of 3-5 tokens and vote-share gates: a datastore match is
proposed only when at least `min_share` of its occurrences agree on the first token (one
occurrence: always), else the drafter's block is. The drafter's accepted count at each anchor
comes from lookup_teacher_forced.py (block 8), lookup's and the datastore's from comparing
their proposals (up to 15 and 7 tokens, as the engine) with the continuation.
Usage: python datastore_gate_sim.py TEACHER_FORCED.json STORE.npz OUT.json"""

import collections
import json
import sys

from dflash2_mlx.engine.datastore import DEFAULT_DATASTORE_LENGTH, Datastore
from replay_rows import agreed, model_free_rows

BLOCK, LOOKUP_LENGTH = 8, 15
data = json.load(open(sys.argv[1]))


def replay(rows_of, min_share: float) -> dict:
    per = collections.defaultdict(lambda: [0, 0])  # category -> [tokens, rounds]
    rounds, committed = collections.Counter(), collections.Counter()  # by source
    for s, rows in zip(data, rows_of):
        t, start, ok = s["tokens"], s["start"], s["ok"]
        a = start
        while a - start < len(ok):
            look, m = rows[a - start]
            if look:
                n, src = agreed(t, a, look), "lookup"
            elif m is not None and m.share >= min_share:
                n, src = agreed(t, a, m.tokens), "datastore"
            else:
                n, src = sum(ok[a - start][: BLOCK - 1]), "drafter"
            rounds[src] += 1
            committed[src] += n + 1
            per[s["cat"]][0] += n + 1
            per[s["cat"]][1] += 1
            a += n + 1
    total = [sum(v[i] for v in per.values()) for i in (0, 1)]
    return {
        "tau": round(total[0] / total[1], 4),
        "rounds": dict(rounds),
        "tau_by_source": {k: round(committed[k] / rounds[k], 3) for k in rounds},
        "per_category": {c: round(v[0] / v[1], 3) for c, v in sorted(per.items())},
    }


runs = []
for min_match in (3, 4, 5):
    rows_of = model_free_rows(
        data,
        Datastore.load(sys.argv[2], min_match=min_match),
        LOOKUP_LENGTH,
        DEFAULT_DATASTORE_LENGTH,
    )
    for min_share in (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99):
        r = {"min_match": min_match, "min_share": min_share, **replay(rows_of, min_share)}
        runs.append(r)
        print(min_match, min_share, r["tau"], r["rounds"], r["tau_by_source"], flush=True)
record = {
    "what": __doc__.split("\nUsage")[0],
    "teacher_forced": sys.argv[1],
    "store": sys.argv[2],
    "block": BLOCK,
    "runs": runs,
}
json.dump(record, open(sys.argv[3], "w"), indent=1)
