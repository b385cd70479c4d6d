"""Teacher-forced τ of the DFlash2 selector's greedy walks: the stepwise walk (the official one)
vs the expected walk (drafter/selector.py) at several calibrations, on greedy regenerations
(features computed here, drafts from the drafter's draft vocabulary as in the engine), at 3
and 7 drafts (blocks 4 and 8), anchors every 2nd response position.
Usage: python expected_walk.py REGEN.jsonl [--drafter DIR] [--limit N] [--out J]"""

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import argparse
import json
import random
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm import load

from dflash2_mlx.checkpoint import load_drafter
from dflash2_mlx.registry import resolve
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.train.batches import make_blocks, sample_anchors
from dflash2_mlx.train.features import StoredSequence
from dflash2_mlx.train.objective import block_hidden
from dflash2_mlx.train.records import read_records

WALKS = {"stepwise": None, "expected-1.0": 1.0, "expected-1.5": 1.5, "expected-2.0": 2.0}

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("regen", type=Path)
ap.add_argument("--drafter", default=None, help="a drafter folder (default: the shipped one)")
ap.add_argument("--limit", type=int, default=None, help="the first N greedy records")
ap.add_argument("--out", type=Path, default=None)
args = ap.parse_args()
shipped = resolve("smollm2-135m")
model, _ = load(shipped.target)
drafter = load_drafter(args.drafter or shipped.drafter)
adapter = TargetAdapter(model, drafter.config.target_layer_ids)
drafter.bind(adapter.binding())
selector = drafter.candidate_selector
records = [r for r in read_records(args.regen) if r["temperature"] == 0.0][: args.limit]
leads = {f"{g}:{w}": [] for g in (3, 7) for w in WALKS}
for rec in records:
    ids = rec["prompt_ids"] + rec["response_ids"]
    features = adapter.forward(mx.array([ids]), None).features[0].astype(mx.float16)
    seq = StoredSequence(
        rec["id"], 0.0, np.array(ids, np.int32), len(rec["prompt_ids"]), np.array(features)
    )
    anchors = sample_anchors(seq, 0, 8, random.Random(0), every=2)
    if anchors is None:
        continue
    blocks = make_blocks(
        [seq], [anchors], 8, drafter.config.mask_token_id, mx.ones((features.shape[-1],))
    )
    _, block_ids, gold = blocks.flat()
    hidden = block_hidden(drafter, blocks)[:, 1:]
    logits = drafter.draft_logits(hidden)
    gold = np.array(gold)
    for g in (3, 7):
        for name, calibration in WALKS.items():
            selector.walk_calibration = calibration
            drafts = drafter.select(
                hidden[:, :g], logits[:, :g], block_ids[:, 0], 0.0, vocab=drafter.draft_vocab
            ).tokens
            ok = (np.array(drafts) == gold[:, :g]).astype(np.int64)
            leads[f"{g}:{name}"] += (np.cumprod(ok, -1).sum(-1) + 1).tolist()
record = {
    "regen": str(args.regen),
    "drafter": args.drafter or "shipped",
    "sequences": len(records),
    "blocks": len(leads["3:stepwise"]),
    "tau": {k: round(float(np.mean(v)), 4) for k, v in leads.items()},
}
print(json.dumps(record))
if args.out:
    args.out.write_text(json.dumps(record, indent=1))
