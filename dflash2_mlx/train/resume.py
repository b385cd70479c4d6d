"""What a checkpoint holds to resume a run, read back: the state file, the optimizer's state,
the feature scaling and the batch sampler's random state. A file that does not read (cut
short, edited, lost) is one CheckpointError naming it and what to do."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from ..values import is_int


def damaged(path: Path, exc: BaseException, ckpt: Path) -> CheckpointError:
    """The error for a checkpoint file that does not read."""
    return CheckpointError(
        f"{path}: cannot resume from it ({str(exc)[:160]}); restore it, or delete {ckpt.parent} "
        "to train afresh (the data in --work stays)"
    )


def read_state(path: Path) -> dict:
    """A checkpoint's state.json, checked for what resuming reads from it."""
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
        if not is_int(state.get("step")) or state["step"] < 0:
            raise ValueError(f"step {state.get('step')!r} is not a step number")
        if not isinstance(state.get("history"), list):
            raise ValueError("no history list")
        if not isinstance(state.get("config", {}), dict):
            raise ValueError("config is not an object")
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are too
        raise damaged(path, exc, path.parent) from None
    return state


def read_arrays(ckpt: Path, width: int) -> tuple[dict, np.ndarray]:
    """(the optimizer's state as mx.load gives it, the feature scaling: `width` values)."""
    import mlx.core as mx

    path = ckpt / "optimizer.npz"
    try:
        if not path.is_file():  # mx.load would call a missing file no zip file
            raise FileNotFoundError("no such file")
        optimizer = mx.load(str(path))
        path = ckpt / "feature_scale.npy"
        scale = np.load(path)
        if scale.shape != (width,):
            raise ValueError(f"shape {scale.shape}, not ({width},)")
        return optimizer, scale
    except (OSError, EOFError, ValueError, RuntimeError) as exc:  # what the loaders raise
        raise damaged(path, exc, ckpt) from None


def rng_state(rng: random.Random) -> dict:
    version, words, gauss = rng.getstate()
    return {"version": version, "words": list(words), "gauss": gauss}


def restored_rng(saved, seed: int) -> random.Random:
    """The batch sampler as it was saved, so a resumed run draws what the uninterrupted one
    would; a checkpoint from before the whole state was kept reseeds."""
    rng = random.Random(seed)
    if isinstance(saved, dict):
        rng.setstate((saved["version"], tuple(saved["words"]), saved["gauss"]))
    return rng
