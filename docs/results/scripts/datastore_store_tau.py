"""Engine τ (greedy, block 8, the embedded pair's drafter) with a given datastore file,
minimum match, vote-share gate and context lookup — what `dflash2 evaluate --blocks 8
--temperatures 0` measures, for a store not yet shipped or settings the CLI does not expose.
Usage: python datastore_store_tau.py STORE.npz MIN_MATCH OUT.json [--min-share S]
  [--prompts heldout|FILE] [--max-tokens 256] [--lookup 3] [--drafter DIR]"""

import dflash2_mlx  # noqa: F401  (binds the BLAS before mlx)

import argparse
import json
import time

from dflash2_mlx import load_pair
from dflash2_mlx.engine.datastore import DEFAULT_MIN_SHARE, Datastore
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.registry import resolve
from dflash2_mlx.train.evaluate import measure_tau

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("store")
ap.add_argument("min_match", type=int)
ap.add_argument("out")
ap.add_argument("--min-share", type=float, default=DEFAULT_MIN_SHARE)
ap.add_argument("--prompts", default="heldout")
ap.add_argument("--max-tokens", type=int, default=256)
ap.add_argument("--lookup", type=int, default=3, help="context lookup's min match (0: off)")
ap.add_argument("--drafter", default=None, help="a drafter folder (default: the shipped one)")
args = ap.parse_args()
shipped = resolve("smollm2-135m")
pair = load_pair(shipped.target, args.drafter or shipped.drafter, lookup=args.lookup)
pair.decoder.datastore = Datastore.load(args.store, args.min_match, args.min_share)
t0 = time.time()
res = measure_tau(
    pair,
    load_prompts(args.prompts),
    block_sizes=(8,),
    temperatures=(0.0,),
    max_tokens=args.max_tokens,
)
record = {
    "store": args.store,
    "min_match": args.min_match,
    "min_share": args.min_share,
    "prompts": args.prompts,
    "max_tokens": args.max_tokens,
    "lookup": args.lookup,
    "drafter": args.drafter or "shipped",
    "tokens_in_store": len(pair.decoder.datastore),
    "seconds": round(time.time() - t0),
    "results": res,
}
with open(args.out, "w") as fh:
    json.dump(record, fh, indent=1)
print(json.dumps(record))
