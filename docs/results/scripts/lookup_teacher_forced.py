"""Teacher-forced drafts of a drafter checkpoint at every anchor of the held-out greedy
continuations -> teacher_forced_ok.json (input of lookup_sim.py).
Usage: python lookup_teacher_forced.py CHECKPOINT_DIR WORK_DIR [--target DIR] [--regen FILE]
  [--out teacher_forced_ok.json] [--draft-vocab N]  (WORK_DIR: a `dflash2 train` work folder with
features_heldout_1-8-15-22-29; CHECKPOINT_DIR: a training checkpoint with feature_scale.npy
or an exported drafter). Drafts from the drafter's draft vocabulary, as the engine does
(before 2026-12-04: from the whole vocabulary; --draft-vocab N: its N most frequent ids), by
the expected walk (since 2026-12-05; "p": each draft's probability under the walk's own
conditionals softmax(scores), the input of walk_confidence.py)."""

import dflash2_mlx  # noqa: F401  (binds the fast BLAS before MLX loads)
import argparse
import json
from pathlib import Path
import mlx.core as mx
import numpy as np
from mlx_lm import load
from dflash2_mlx.checkpoint import load_drafter
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.train.features import load_feature_cache
from dflash2_mlx.train.trainer import make_blocks
from dflash2_mlx.train.objective import block_hidden
from dflash2_mlx.drafter.selector import EXPECTED_WALK_CALIBRATION
from dflash2_mlx.kernels import expected_walk_choices


def path_probs(scores: mx.array, path: mx.array) -> mx.array:
    """p_t(path_t | path_{t-1}) under softmax(scores): the walk's own belief in each draft."""
    probs = mx.softmax(scores.astype(mx.float32), -1)
    prev = mx.concatenate([mx.zeros((path.shape[0], 1), mx.int32), path[:, :-1]], 1)
    rows = mx.take_along_axis(probs, prev[:, :, None, None], axis=2)[:, :, 0]
    return mx.take_along_axis(rows, path[:, :, None], axis=-1)[:, :, 0]


ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("checkpoint", type=Path)
ap.add_argument("work", type=Path)
ap.add_argument(
    "--target", default=str(Path.home() / ".cache/dflash2/models/smollm2-135m-instruct")
)
ap.add_argument(
    "--regen", type=Path, default=Path(__file__).parents[3] / "data/smollm2/regen_heldout.jsonl"
)
ap.add_argument("--out", default="teacher_forced_ok.json")
ap.add_argument("--draft-vocab", type=int, default=None, help="only its N most frequent draft ids")
args = ap.parse_args()
ck, W = args.checkpoint, args.work
model, tok = load(args.target)
d = load_drafter(ck, dtype=mx.float32, draft_vocab_limit=args.draft_vocab)
d.bind(TargetAdapter(model, d.config.target_layer_ids).binding())
# A training checkpoint keeps its feature scale beside it; an exported drafter has it in fc.
scale_file = ck / "feature_scale.npy"
held = [s for s in load_feature_cache(W / "features_heldout_1-8-15-22-29") if s.temperature == 0.0]
scale = (
    mx.array(np.load(scale_file)) if scale_file.exists() else mx.ones((held[0].features.shape[-1],))
)
cats = {json.loads(line)["id"]: json.loads(line)["category"] for line in open(args.regen)}
out = []
for s in held:
    lo, hi = s.response_start, len(s.tokens) - 8
    if hi < lo:
        continue
    anchors = list(range(lo, hi + 1))
    lead, conf = [], []
    for i in range(0, len(anchors), 64):
        a = anchors[i : i + 64]
        b = make_blocks([s], [a], 8, d.config.mask_token_id, scale)
        _, ids, gold = b.flat()
        h = block_hidden(d, b)[:, 1:]
        cand, scores = d.candidate_selector.lattice(h, d.draft_logits(h), ids[:, 0], d.draft_vocab)
        path = expected_walk_choices(scores, EXPECTED_WALK_CALIBRATION)
        drafts = mx.take_along_axis(cand, path[..., None], axis=-1)[..., 0]
        conf += np.round(np.array(path_probs(scores, path)), 4).tolist()
        ok = (drafts == gold).astype(mx.int32)
        lead += np.array(mx.cumprod(ok, axis=-1)).tolist()
    out.append(
        {
            "id": s.id,
            "cat": cats.get(s.id, "?"),
            "tokens": s.tokens.tolist(),
            "start": lo,
            "ok": lead,
            "p": conf,
        }
    )
    print(s.id, len(anchors), flush=True)
json.dump(out, open(args.out, "w"))
