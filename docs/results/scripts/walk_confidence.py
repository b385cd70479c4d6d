"""Is the expected walk's own confidence worth acting on? From a teacher-forced dump of
lookup_teacher_forced.py (every anchor of the 61 held-out greedy continuations, block-8 drafts
with "p", each draft's probability under the walk's conditionals), with round costs from an
autotune profile (draft pass of the block + verify of the width, ms):
1. calibration: the walk's P(first k drafts accepted) = prod p vs the observed rate;
2. confidence-cut widths: per round, verify only the first d drafts, d maximising
   E[committed] - R * cost (R iterated to the realised rate), vs every fixed width, and vs an
   oracle that knows each round's acceptance;
3. drafter over datastore: replay lookup > datastore > drafter (as the engine: lookup up to 11
   drafts, datastore up to 7 with the share gate) and let the drafter's expected accepted drafts
   overrule a datastore match above a threshold (the draft pass then always runs), vs an oracle.
Usage: python walk_confidence.py TEACHER_FORCED.json STORE.npz AUTOTUNE.json OUT.json"""

import collections
import json
import sys

import numpy as np

from dflash2_mlx.engine.datastore import Datastore
from replay_rows import agreed, model_free_rows

data = json.load(open(sys.argv[1]))
profile = json.load(open(sys.argv[3]))
VERIFY = {int(k): v for k, v in profile["verify"]["ms"].items()}
DRAFT = {int(k): v for k, v in profile["draft"]["ms"].items()}
LOOKUP_DRAFTS, STORE_DRAFTS = 11, 7
p = np.array([row for s in data for row in s["p"]])
acc = np.array([row for s in data for row in s["ok"]], dtype=float)  # leading accepted (0/1)
belief = np.cumprod(p, 1)


def verify_ms(width: int) -> float:  # past 8 tokens: the profile's slope
    return VERIFY[min(width, 8)] + max(0, width - 8) * (VERIFY[8] - VERIFY[4]) / 4


def calibration() -> dict:
    out = {}
    for k in range(7):
        bins = np.digitize(belief[:, k], [0.1, 0.2, 0.4, 0.6, 0.8, 0.9])
        out[str(k + 1)] = [
            {
                "believed": round(belief[m, k].mean(), 3),
                "observed": round(acc[m, k].mean(), 3),
                "rounds": int(m.sum()),
            }
            for b in range(7)
            if (m := bins == b).sum() >= 20
        ]
    return out


def widths(block: int, expected: np.ndarray | None, rate: float) -> dict:
    """Rounds of the drafter alone, each verifying d(round) drafts (expected None: the oracle)."""
    options = range(1, block)
    cost = np.array([DRAFT[block] + verify_ms(d + 1) for d in options])
    gain = np.stack([1 + acc[:, :d].sum(1) for d in options], 1)
    guess = gain if expected is None else 1 + np.cumsum(expected, 1)[:, : block - 1]
    for _ in range(30):
        pick = (guess - rate * cost).argmax(1)
        rate = gain[np.arange(len(gain)), pick].sum() / cost[pick].sum()
    return {
        "tok_s": round(1000 * rate, 3),
        "tau": round(gain[np.arange(len(gain)), pick].mean(), 4),
        "drafts_verified": np.bincount(pick + 1, minlength=block)[1:].tolist(),
    }


def replay(rows_of: list, block: int, prefer_drafter) -> dict:
    tokens = ms = 0.0
    rounds = collections.Counter()
    for s, rows in zip(data, rows_of):
        t, start, ok, probs = s["tokens"], s["start"], s["ok"], s["p"]
        a = start
        while a - start < len(ok):
            i = a - start
            look, match = rows[i]
            mine = sum(ok[i][: block - 1])
            drafter = (mine, "drafter", DRAFT[block] + verify_ms(block))
            if look:
                n, src, cost = agreed(t, a, look), "lookup", verify_ms(len(look) + 1)
            elif match is not None and match.share >= store.min_share:
                theirs = agreed(t, a, match.tokens)
                expected = float(np.cumprod(probs[i][: block - 1]).sum())
                if prefer_drafter(expected, theirs, mine):
                    n, src, cost = mine, "drafter over datastore", drafter[2]
                else:
                    n, src, cost = theirs, "datastore", verify_ms(len(match.tokens) + 1)
            else:
                n, src, cost = drafter
            rounds[src] += 1
            tokens, ms = tokens + n + 1, ms + cost
            a += n + 1
    return {
        "tau": round(tokens / sum(rounds.values()), 4),
        "tok_s": round(1000 * tokens / ms, 3),
        "rounds": dict(rounds),
    }


store = Datastore.load(sys.argv[2])
rows_of = model_free_rows(data, store, LOOKUP_DRAFTS, STORE_DRAFTS)
record = {
    "what": __doc__.split("\nUsage")[0],
    "teacher_forced": sys.argv[1],
    "store": sys.argv[2],
    "device": profile["key"]["device"],
    "verify_ms": VERIFY,
    "draft_ms": DRAFT,
    "anchors": len(p),
    "calibration": calibration(),
    "widths": {},
    "datastore": {},
}
for block in (4, 8):
    fixed = {}
    for d in range(1, block):
        gain = 1 + acc[:, :d].sum(1)
        fixed[str(d)] = {
            "tok_s": round(1000 * gain.sum() / (len(gain) * (DRAFT[d + 1] + verify_ms(d + 1))), 3),
            "tau": round(gain.mean(), 4),
        }
    best = max(v["tok_s"] for v in fixed.values()) / 1000
    record["widths"][str(block)] = {
        "fixed (drafted at block d + 1)": fixed,
        **{f"confidence^{a}": widths(block, belief**a, best) for a in (1.0, 1.25, 1.5, 2.0)},
        "oracle": widths(block, None, best),
    }
    arms = {
        "datastore always (shipped)": lambda e, th, mi: False,
        "oracle": lambda e, th, mi: mi > th,
    }
    for threshold in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0):
        arms[f"drafter when expected > {threshold}"] = lambda e, th, mi, x=threshold: e > x
    record["datastore"][str(block)] = {k: replay(rows_of, block, f) for k, f in arms.items()}
    print(
        block, json.dumps(record["widths"][str(block)]), json.dumps(record["datastore"][str(block)])
    )
json.dump(record, open(sys.argv[4], "w"), indent=1)
