"""Average exported drafters' weights (checkpoint averaging along one training line: the stage
endpoints of one drafter's runs, each a fine-tune of the one before) into a new drafter folder,
and measure its held-out teacher-forced τ as `dflash2 train`'s last evaluation does.

    python tools/average_drafters.py OUT HELDOUT_FEATURES DRAFTER:WEIGHT [DRAFTER:WEIGHT ...]

Weights are normalised to sum to 1. OUT gets model.safetensors (each tensor in the first
drafter's dtype), the last drafter's config.json and draft_vocab.json (when it has one), and
tau61.json. HELDOUT_FEATURES is a `dflash2 train --work` folder's features_heldout_<layers>
(the trainer writes it; its layer ids must be the drafters'). The drafters must share one
config: an average of different shapes or targets is refused.
"""

from __future__ import annotations

import dflash2_mlx  # noqa: F401  (binds the BLAS before mlx)

import json
import math
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx


def parse_parts(args: list[str]) -> list[tuple[Path, float]]:
    parts = []
    for a in args:
        path, _, weight = a.rpartition(":")
        if not path or not all(
            (Path(path) / f).is_file() for f in ("model.safetensors", "config.json")
        ):
            sys.exit(
                f"{a!r}: expected DRAFTER_FOLDER:WEIGHT, the folder with model.safetensors and config.json"
            )
        try:
            w = float(weight)
        except ValueError:
            sys.exit(f"{a!r}: the weight {weight!r} is not a number")
        if not (w > 0 and math.isfinite(w)):
            sys.exit(f"{a!r}: the weight must be a finite number > 0")
        parts.append((Path(path), w))
    configs = {
        json.dumps(json.loads((p / "config.json").read_text()), sort_keys=True) for p, _ in parts
    }
    if len(configs) != 1:
        sys.exit("the drafters' config.json files differ: only one model's weights can be averaged")
    return parts


def average(parts: list[tuple[Path, float]]) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The weighted mean of each tensor (in fp32, then the first drafter's dtype) and the first
    file's metadata."""
    total = sum(w for _, w in parts)
    first, metadata = mx.load(str(parts[0][0] / "model.safetensors"), return_metadata=True)
    acc = {k: mx.zeros(v.shape, mx.float32) for k, v in first.items()}
    for path, w in parts:
        weights = mx.load(str(path / "model.safetensors"))
        if set(weights) != set(acc):
            sys.exit(f"{path}: its tensors are not the first drafter's")
        for k, v in weights.items():
            acc[k] = acc[k] + v.astype(mx.float32) * (w / total)
    return {k: v.astype(first[k].dtype) for k, v in acc.items()}, metadata


def heldout_tau(folder: Path, features: Path) -> dict:
    from mlx_lm import load

    from dflash2_mlx.checkpoint import load_drafter
    from dflash2_mlx.embedded import ensure_smollm2
    from dflash2_mlx.target.adapter import TargetAdapter
    from dflash2_mlx.train.features import load_feature_cache
    from dflash2_mlx.train.trainer import evaluate_proxy

    config = json.loads((folder / "config.json").read_text())
    model, _ = load(str(ensure_smollm2()))
    layers = config["dflash_config"]["target_layer_ids"]
    drafter = load_drafter(folder, draft_vocab=False).bind(TargetAdapter(model, layers).binding())
    held = [s for s in load_feature_cache(features) if s.temperature == 0.0]
    ones = mx.ones((held[0].features.shape[-1],))  # exported drafters carry their scale in fc
    return evaluate_proxy(drafter, held, ones, len(held)) | {"sequences": len(held)}


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, features = Path(sys.argv[1]), Path(sys.argv[2])
    if not features.is_dir():
        sys.exit(f"{features}: not a folder of held-out features (W/features_heldout_<layers>)")
    parts = parse_parts(sys.argv[3:])
    out.mkdir(parents=True, exist_ok=True)
    weights, metadata = average(parts)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata=metadata)
    last = parts[-1][0]
    for name in ("config.json", "draft_vocab.json"):
        if (last / name).is_file():
            shutil.copy(last / name, out / name)
    t0 = time.perf_counter()
    record = heldout_tau(out, features)
    record |= {"parts": [[str(p), w] for p, w in parts], "seconds": round(time.perf_counter() - t0)}
    (out / "tau61.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
