"""Round-by-round replay of lookup > datastore > drafter on the 61 held-out greedy
continuations, for context lookup with keys of 2 or 3 tokens where a match whose agreeing
context is shorter than `full` tokens proposes at most `short` drafts (its verify stays narrow),
and for short matches tried before or after the datastore. Reports τ and tokens per unit of
cost, a round costing a draft pass (drafter rounds) plus a verify of its width, in units of a
one-token verify: verify(w) = 1 + (w - 1) / TOKENS_PER_UNIT (20 and 12: the range measured on
the x86 hosts), draft pass DRAFT (0.15). The drafter's accepted count at each anchor comes from
lookup_teacher_forced.py (its block-8 drafts cut to the block), the others' from comparing
their proposals with the continuation.
Usage: python lookup_cap_sim.py TEACHER_FORCED.json STORE.npz OUT.json [--block 4]"""

import argparse
import collections
import json

from dflash2_mlx.engine.datastore import DEFAULT_DATASTORE_LENGTH, Datastore
from dflash2_mlx.engine.lookup import ContextLookup
from replay_rows import agreed

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("teacher_forced")
ap.add_argument("store")
ap.add_argument("out")
ap.add_argument("--block", type=int, default=4)
ap.add_argument("--lookup-length", type=int, default=15)
args = ap.parse_args()
data = json.load(open(args.teacher_forced))
store = Datastore.load(args.store)
DRAFT = 0.15


def proposals(min_match: int) -> list[list]:
    """Per sequence and anchor: (lookup's proposal, its agreement, the datastore's match)."""
    out = []
    for s in data:
        t, start = s["tokens"], s["start"]
        look = ContextLookup(min_match, sure=0)  # uncapped: the caps are replayed here
        look.extend(t[: start + 1])
        rows = []
        for a in range(start, start + len(s["ok"])):
            found, agree = look.find(args.lookup_length)
            rows.append((found, agree, store.match(t[: a + 1], DEFAULT_DATASTORE_LENGTH)))
            look.extend(t[a + 1 : a + 2])
        out.append(rows)
    return out


def replay(rows_of, full: int, short: int, short_first: bool, store_len: int = 99) -> dict:
    per = collections.defaultdict(lambda: [0, 0])  # category -> [tokens, rounds]
    rounds, committed = collections.Counter(), collections.Counter()
    widths = []  # (width, drafter round) per round
    for s, rows in zip(data, rows_of):
        t, start, ok = s["tokens"], s["start"], s["ok"]
        a = start
        while a - start < len(ok):
            look, agree, m = rows[a - start]
            store_ok = m is not None and m.share >= store.min_share
            is_short = bool(look) and agree < full
            if look and not is_short:
                prop, src = look, "lookup"
            elif is_short and (short_first or not store_ok) and short > 0:
                prop, src = look[:short], "lookup-short"
            elif store_ok:
                prop, src = m.tokens[:store_len], "datastore"
            else:
                prop, src = None, "drafter"
            if prop is None:
                n, width = sum(ok[a - start][: args.block - 1]), args.block
            else:
                n, width = agreed(t, a, prop), len(prop) + 1
            rounds[src] += 1
            committed[src] += n + 1
            widths.append((width, src == "drafter"))
            per[s["cat"]][0] += n + 1
            per[s["cat"]][1] += 1
            a += n + 1
    tokens, n_rounds = (sum(v[i] for v in per.values()) for i in (0, 1))
    speed = {}
    for tpu in (20, 12):
        cost = sum(1 + (w - 1) / tpu + (DRAFT if d else 0.0) for w, d in widths)
        speed[str(tpu)] = round(tokens / cost, 4)
    return {
        "tau": round(tokens / n_rounds, 4),
        "tokens_per_unit": speed,
        "rounds": dict(rounds),
        "tau_by_source": {k: round(committed[k] / rounds[k], 3) for k in rounds},
        "per_category": {c: round(v[0] / v[1], 3) for c, v in sorted(per.items())},
    }


runs = []
for min_match in (3, 2):
    rows_of = proposals(min_match)
    configs = [(0, 99, True)] + [
        (full, short, first)
        for full in (3, 4)
        for short in (0, 1, 2, 3, 5, 7)
        for first in (True, False)
        if full > min_match or (short, first) == (99, True)
    ]
    for full, short, first in configs:
        r = {"min_match": min_match, "full": full, "short": short, "short_first": first}
        r.update(replay(rows_of, full, short, first))
        runs.append(r)
        print(
            min_match, full, short, first, r["tau"], r["tokens_per_unit"], r["rounds"], flush=True
        )
    if min_match == 2:  # the chosen lookup, with datastore proposals cut shorter
        for store_len in (2, 3, 4, 5):
            r = {"min_match": 2, "full": 3, "short": 5, "short_first": True, "store_len": store_len}
            r.update(replay(rows_of, 3, 5, True, store_len))
            runs.append(r)
            print("store_len", store_len, r["tau"], r["tokens_per_unit"], flush=True)
json.dump(
    {
        "what": __doc__.split("\nUsage")[0],
        "teacher_forced": args.teacher_forced,
        "store": args.store,
        "block": args.block,
        "runs": runs,
    },
    open(args.out, "w"),
    indent=1,
)
