"""Roll target caches back to an accepted prefix after a verify forward.

Attention caches (KVCache and friends) trim their tail. Recurrent caches (Gated-DeltaNet,
Mamba: mlx-lm's ArraysCache) cannot be trimmed, so their state is recomputed exactly: restore
the snapshot taken before the verify forward and re-run that layer over the kept rows.
"""

from __future__ import annotations

import mlx.core as mx

from . import gdn
from .capture import Capture


def _prefix(value, keep: int, length: int):
    """Slice the sequence axis of a recorded argument down to `keep` rows."""
    if isinstance(value, mx.array) and value.ndim >= 2 and value.shape[1] == length:
        return value[:, :keep]
    if isinstance(value, mx.array) and value.ndim >= 2 and value.shape[-1] == length:
        return value[..., :keep]  # [B, L] style masks
    return value


def rollback_caches(cache: list, capture: Capture, keep: int, length: int) -> None:
    recurrent = {id(r.cache) for r in capture.replays} | {id(r.cache) for r in capture.gdn}
    for c in cache:
        if id(c) not in recurrent:
            c.trim(length - keep)
    for g in capture.gdn:
        gdn.rollback(g, keep)
    for r in capture.replays:
        r.cache.state = r.snapshot
        if keep == 0:
            continue
        args = tuple(_prefix(a, keep, length) for a in r.args)
        kwargs = {k: _prefix(v, keep, length) for k, v in r.kwargs.items()}
        r.layer(*args, **kwargs)
