"""Engine τ on all 61 held-out prompts (256 tokens, block 8, greedy, lookup 3, the embedded
pair's drafter) with a given datastore file and minimum match — what `dflash2 evaluate
--max-tokens 256 --blocks 8 --temperatures 0` measures, for a store not yet shipped or a min
match the CLI does not expose.
Usage: python datastore_store_tau.py STORE.npz MIN_MATCH OUT.json"""

import dflash2_mlx  # noqa: F401  (binds the BLAS before mlx)

import json
import sys
import time

from dflash2_mlx.api import load_pair
from dflash2_mlx.engine.datastore import Datastore
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.train.evaluate import measure_tau

store, min_match, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pair = load_pair("smollm2-135m")
pair.decoder.datastore = Datastore.load(store, min_match=min_match)
t0 = time.time()
res = measure_tau(
    pair, load_prompts("heldout"), block_sizes=(8,), temperatures=(0.0,), max_tokens=256
)
record = {
    "store": store,
    "min_match": min_match,
    "tokens_in_store": len(pair.decoder.datastore),
    "seconds": round(time.time() - t0),
    "results": res,
}
with open(out, "w") as fh:
    json.dump(record, fh, indent=1)
print(json.dumps(record))
