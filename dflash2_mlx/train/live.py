"""Features computed when a training step draws a sequence (`dflash2 train --live-features`).

The feature cache (features.py) runs the target over every training sequence before the
first step and stores 5.8 KB a token. A fine-tuning run draws far fewer: 400 steps × 8
sequences touch at most 3,200 of stage 18's 15,695, so caching them all costs hours of
prefill (and gigabytes) that training never reads. Here a sequence's features come from one
target forward when a step draws it; the most recent ones are kept for the next read.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..target.adapter import TargetAdapter
from .features import Sequence_, target_features

KEEP = 64  # sequences whose features stay in memory (~2.6 MB each at 450 tokens, SmolLM2)


class LiveFeatures:
    """The target's features of a sequence, computed on first use; the last `keep` kept."""

    def __init__(self, adapter: TargetAdapter, keep: int = KEEP):
        self.adapter = adapter
        self.keep = keep
        self.computed = 0  # target forwards run (a measure of the work done)
        self._kept: OrderedDict[tuple[str, float], np.ndarray] = OrderedDict()

    def __call__(self, seq: Sequence_) -> np.ndarray:
        key = (seq.id, seq.temperature)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        features = target_features(self.adapter, [seq], greedy=False)[0][0]
        self.computed += 1
        self._kept[key] = features
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
        return features


class LiveSequence:
    """A training regeneration as the trainer reads a StoredSequence, its features [S, F]
    float16 computed by `source` when read."""

    greedy = None  # regenerations are labelled by their own next tokens
    spans = None

    def __init__(self, seq: Sequence_, source: LiveFeatures):
        self.id, self.temperature = seq.id, seq.temperature
        self.tokens = np.array(seq.tokens, dtype=np.int32)
        self.response_start = seq.response_start
        self._seq, self._source = seq, source

    @property
    def features(self) -> np.ndarray:
        return self._source(self._seq)


def live_sequences(adapter: TargetAdapter, seqs: list[Sequence_]) -> list[LiveSequence]:
    source = LiveFeatures(adapter)
    return [LiveSequence(s, source) for s in seqs]
