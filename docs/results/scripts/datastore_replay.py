"""Model-free replay of response datastores on the held-out greedy continuations: at every
answer position where context lookup (min_match 3) finds nothing, what each datastore proposes
(7 tokens at most, as the engine) and how many of those tokens the target's own continuation
confirms. A cheap first look before the engine run (datastore_tau.py --against): it ignores the
drafter (which a datastore round replaces) and how rounds skip positions.
Usage: python datastore_replay.py A.npz [B.npz ...] [--regen data/smollm2/regen_heldout.jsonl]
  [--out J]"""

import argparse
import json
from pathlib import Path

from dflash2_mlx.engine.datastore import DEFAULT_DATASTORE_LENGTH, Datastore
from dflash2_mlx.engine.lookup import DEFAULT_LOOKUP, ContextLookup
from dflash2_mlx.train.records import read_records

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("stores", nargs="+", type=Path)
ap.add_argument(
    "--regen", type=Path, default=Path(__file__).parents[3] / "data/smollm2/regen_heldout.jsonl"
)
ap.add_argument("--out", type=Path, default=None)
args = ap.parse_args()
stores = {f"{i}:{p}": Datastore.load(p) for i, p in enumerate(args.stores)}
stats = {k: {"positions": 0, "matched": 0, "confirmed": 0, "first_ok": 0} for k in stores}
for rec in read_records(args.regen):
    if rec["temperature"] != 0.0:
        continue
    prompt, answer = rec["prompt_ids"], rec["response_ids"]
    look = ContextLookup(DEFAULT_LOOKUP)
    look.reset(prompt + answer[:1])
    for p in range(1, len(answer) - 1):
        ctx = prompt + answer[:p]
        if not look.propose(DEFAULT_DATASTORE_LENGTH):
            truth = answer[p : p + DEFAULT_DATASTORE_LENGTH]
            for name, store in stores.items():
                s = stats[name]
                s["positions"] += 1
                found = store.propose(ctx, DEFAULT_DATASTORE_LENGTH)
                ok = 0
                while ok < min(len(found), len(truth)) and found[ok] == truth[ok]:
                    ok += 1
                s["matched"] += bool(found)
                s["confirmed"] += ok
                s["first_ok"] += ok > 0
        look.extend(answer[p : p + 1])
for name, s in stats.items():
    meta = stores[name].meta
    s["datastore"] = {
        "tokens": int(meta.get("tokens", len(stores[name]))),
        "responses": meta.get("responses"),
        "files": [src["file"] for src in meta.get("sources", [])],
    }
    print(name, s)
if args.out:
    args.out.write_text(json.dumps({"regen": str(args.regen), "stats": stats}, indent=1) + "\n")
