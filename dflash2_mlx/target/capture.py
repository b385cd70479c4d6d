"""Capture layer outputs (and recurrent-layer inputs) of an mlx-lm model for one forward call.

No class is patched: for the duration of one call, selected entries of *this model instance's*
layer list are replaced by recording proxies, and restored afterwards (also on error). Two
targets in one process never see each other's proxies.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import mlx.core as mx


@dataclass
class ReplayRecord:
    """What a recurrent layer needs to recompute its state over a prefix of this call."""

    layer: Any
    cache: Any
    args: tuple
    kwargs: dict
    snapshot: Any


@dataclass
class Capture:
    features: dict[int, mx.array] = field(default_factory=dict)  # layer index -> output
    replays: list[ReplayRecord] = field(default_factory=list)


def snapshot_state(cache) -> Any:
    """A restorable copy of a cache's state; arrays are immutable, so references suffice."""
    state = cache.state
    if isinstance(state, tuple):
        return tuple(list(s) if isinstance(s, list) else s for s in state)
    return list(state) if isinstance(state, list) else state


class _Proxy:
    __slots__ = ("_layer", "_index", "_capture", "_cache", "_record_features")

    def __init__(self, layer, index, capture, cache, record_features):
        self._layer, self._index, self._capture = layer, index, capture
        self._cache, self._record_features = cache, record_features

    def __call__(self, *args, **kwargs):
        if self._cache is not None:
            self._capture.replays.append(
                ReplayRecord(self._layer, self._cache, args, kwargs, snapshot_state(self._cache))
            )
        out = self._layer(*args, **kwargs)
        if self._record_features:
            self._capture.features[self._index] = out[0] if isinstance(out, tuple) else out
        return out

    def __getattr__(self, name):
        return getattr(self._layer, name)


_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(layers: list) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(id(layers), threading.Lock())


@contextmanager
def tapped(layers: list, feature_ids: set[int], replay_caches: dict[int, Any]) -> Iterator[Capture]:
    """Within the block, `layers[i]` record their output (i in feature_ids) and, for i in
    replay_caches, their call arguments plus a snapshot of that layer's cache."""
    capture = Capture()
    watched = sorted(feature_ids | set(replay_caches))
    with _lock_for(layers):
        originals = {i: layers[i] for i in watched}
        try:
            for i in watched:
                layers[i] = _Proxy(originals[i], i, capture, replay_caches.get(i), i in feature_ids)
            yield capture
        finally:
            for i, layer in originals.items():
                layers[i] = layer
