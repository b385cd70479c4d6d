"""Capture layer outputs (and recurrent-layer inputs) of an mlx-lm model for one forward call.

No class is patched: for the duration of one call, selected entries of *this model instance's*
layer list are replaced by recording proxies, and restored afterwards (also on error). Two
targets in one process never see each other's proxies, and a proxy records only the calls of
the thread that put it there: another thread running the same model meanwhile (plain mlx-lm,
say) goes straight through to the layer.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import mlx.core as mx

from . import gdn


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
    replays: list[ReplayRecord] = field(default_factory=list)  # generic recurrent layers
    gdn: list[gdn.GDNRecord] = field(default_factory=list)  # Gated-DeltaNet mixers (fast path)


def snapshot_state(cache) -> Any:
    """A restorable copy of a cache's state: its lists and tuples copied at every depth (a
    CacheList's state holds its ArraysCache's own list, which the layer writes in place);
    arrays are immutable, so references suffice."""
    return _copy_containers(cache.state)


def _copy_containers(state):
    if isinstance(state, (list, tuple)):
        return type(state)(_copy_containers(s) for s in state)
    return state


class _Proxy:
    __slots__ = ("_layer", "_index", "_capture", "_cache", "_record_features", "_thread")

    def __init__(self, layer, index, capture, cache, record_features):
        self._layer, self._index, self._capture = layer, index, capture
        self._cache, self._record_features = cache, record_features
        self._thread = threading.get_ident()

    def __call__(self, *args, **kwargs):
        if threading.get_ident() != self._thread:  # not this capture's forward
            return self._layer(*args, **kwargs)
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


class _MixerProxy:
    """Stands in for a Gated-DeltaNet mixer: same computation, inputs recorded."""

    __slots__ = ("_mixer", "_records", "_thread")

    def __init__(self, mixer, records):
        self._mixer, self._records = mixer, records
        self._thread = threading.get_ident()

    def __call__(self, inputs, mask=None, cache=None):
        if threading.get_ident() != self._thread:  # not this capture's forward
            return self._mixer(inputs, mask=mask, cache=cache)
        return gdn.forward(self._mixer, inputs, mask, cache, self._records)

    def __getattr__(self, name):
        return getattr(self._mixer, name)


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
    fast = {i for i in replay_caches if gdn.supports(getattr(layers[i], "linear_attn", None))}
    mixers = [layers[i] for i in sorted(fast)]
    generic = {i: c for i, c in replay_caches.items() if i not in fast}
    watched = sorted(feature_ids | set(generic))
    with _lock_for(layers):
        originals = {i: layers[i] for i in watched}
        try:
            for layer in mixers:  # an instance attribute shadows the module's child, for now
                object.__setattr__(
                    layer, "linear_attn", _MixerProxy(layer.linear_attn, capture.gdn)
                )
            for i in watched:
                layers[i] = _Proxy(originals[i], i, capture, generic.get(i), i in feature_ids)
            yield capture
        finally:
            for i, layer in originals.items():
                layers[i] = layer
            for layer in mixers:
                if "linear_attn" in vars(layer):
                    object.__delattr__(layer, "linear_attn")
