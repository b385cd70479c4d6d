"""One protocol over mlx-lm causal LMs: forward -> logits + captured layer features; rollback.

Works with any mlx-lm model whose decoder stack is a `layers` list called as
`layer(h, mask, cache)`: dense families (llama, qwen2/3, mistral, ...) and hybrid
Gated-DeltaNet families (qwen3_5, qwen3_next). Attention caches roll back by trimming;
recurrent caches by exact recomputation over the accepted prefix (see rollback.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from ..errors import CompatibilityError
from .capture import Capture, tapped
from .head import TargetBinding, cpu_head, restricted_head
from .rollback import rollback_caches

# Families whose logits are exactly head(inner(ids)); others are called whole.
_PLAIN_HEAD_FAMILIES = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_next",
}


def _find_inner(model):
    for path in ((), ("model",), ("language_model", "model"), ("language_model",)):
        obj = model
        try:
            for name in path:
                obj = getattr(obj, name)
        except AttributeError:
            continue
        if hasattr(obj, "embed_tokens") and isinstance(getattr(obj, "layers", None), list):
            return obj
    family = _model_type(model) or f"{type(model).__module__}.{type(model).__name__}"
    raise CompatibilityError(
        f"target family {family!r} is not supported: dflash2 drafts from the layer features "
        "of a decoder with `embed_tokens` and a `layers` list (transformers and hybrids such "
        "as Qwen3.5, Falcon-H1, Jamba), and this model has none"
    )


def _model_type(model) -> str:
    args = getattr(model, "args", None)
    return str(getattr(model, "model_type", None) or getattr(args, "model_type", "") or "")


@dataclass
class Forward:
    """One target forward: logits for the requested rows and the fused features of all rows."""

    logits: mx.array  # [1, L or 1, V]
    features: mx.array  # [1, L, N_f * H]
    capture: Capture


class TargetAdapter:
    def __init__(self, model, layer_ids: Sequence[int]):
        self.model = model
        self.inner = _find_inner(model)
        self.layers: list = self.inner.layers
        self.layer_ids = tuple(int(i) for i in layer_ids)
        n = len(self.layers)
        bad = [i for i in self.layer_ids if not 0 <= i < n]
        if bad:
            raise CompatibilityError(
                f"drafter target_layer_ids {list(self.layer_ids)}: {bad} out of range for a "
                f"target with {n} layers (valid 0..{n - 1})"
            )
        self.embed_tokens = self.inner.embed_tokens
        self.head = cpu_head(self._find_head())
        self.model_type = _model_type(model)
        self._plain_head = self.model_type in _PLAIN_HEAD_FAMILIES
        self.hidden_size = int(self.embed_tokens(mx.array([[0]])).shape[-1])
        self.vocab_size = int(self.embed_tokens.weight.shape[0])

    def _find_head(self):
        for owner in (self.model, getattr(self.model, "language_model", None)):
            head = getattr(owner, "lm_head", None) if owner is not None else None
            if head is not None:
                return head
        return self.embed_tokens.as_linear

    def final_norm(self):
        """The norm between the last decoder layer and the LM head, for families whose logits
        are exactly head(norm(h)); None for the others (softcaps, multipliers)."""
        return getattr(self.inner, "norm", None) if self._plain_head else None

    def binding(self) -> TargetBinding:
        head = self.head
        return TargetBinding(
            self.embed_tokens,
            head,
            float(getattr(self.inner, "embed_scale", 1.0)),
            lambda ids: restricted_head(head, ids),
        )

    # ------------------------------------------------------------------ caches
    def make_cache(self) -> list:
        caches = make_prompt_cache(self.model)
        # A rotating cache cannot be rolled back once it wraps; a plain KV cache with the
        # model's own window mask is exact and trimmable.
        return [KVCache() if isinstance(c, RotatingKVCache) else c for c in caches]

    @staticmethod
    def _recurrent(cache: list) -> dict[int, Any]:
        return {i: c for i, c in enumerate(cache) if not c.is_trimmable()}

    # ------------------------------------------------------------------ forward
    def forward(self, ids: mx.array, cache: list | None, last_logits_only: bool = False) -> Forward:
        """Run ids [B, L] through the target, extending `cache` (None: no cache, e.g. training)."""
        replay = {} if (last_logits_only or cache is None) else self._recurrent(cache)
        with tapped(self.layers, set(self.layer_ids), replay) as cap:
            if self._plain_head:
                hidden = self.inner(ids, cache=cache)
                logits = self.head(hidden[:, -1:] if last_logits_only else hidden)
            else:
                logits = self.model(ids, cache=cache)
                if last_logits_only:
                    logits = logits[:, -1:]
        features = mx.concatenate([cap.features[i] for i in self.layer_ids], axis=-1)
        return Forward(logits, features, cap)

    def prefill(self, ids: mx.array, cache: list, chunk: int = 512, keep_rows: int | None = None):
        """Chunked prefill of ids [1, P] -> (last logits [1, 1, V], features of the last
        `keep_rows` positions (all when None), index of the first kept row)."""
        feed = ChunkedPrefill(self, ids, cache, keep_rows)
        while not feed.done:
            feed.feed(chunk)
        return feed.result()

    def rollback(self, cache: list, fwd: Forward, keep: int, length: int) -> None:
        """Keep only the first `keep` of the `length` rows of the last forward in `cache`."""
        if keep < length:
            rollback_caches(cache, fwd.capture, keep, length)


class ChunkedPrefill:
    """ids [1, P] fed through the target into `cache` a chunk per `feed` call (the caller may
    run other forwards between chunks), keeping the features of the last `keep_rows`
    positions (all when None); `result` once `done`. `rows`: shown every chunk's logits
    [1, n, V] and the index of its first id (else only the last row is computed)."""

    def __init__(
        self,
        adapter: TargetAdapter,
        ids: mx.array,
        cache: list,
        keep_rows: int | None,
        rows: Callable[[mx.array, int], None] | None = None,
    ):
        self.adapter, self.ids, self.cache, self.keep_rows = adapter, ids, cache, keep_rows
        self.rows = rows
        self.total = int(ids.shape[1])
        self.fed = 0  # ids fed so far
        self._kept: list[mx.array] = []
        self._kept_rows = 0
        self._logits: mx.array | None = None

    @property
    def done(self) -> bool:
        return self.fed >= self.total

    @property
    def remaining(self) -> int:
        return self.total - self.fed

    def feed(self, chunk: int) -> int:
        """Run the next `chunk` ids (fewer at the end) through the target; returns how many."""
        start, end = self.fed, min(self.fed + chunk, self.total)
        last_only = self.rows is None
        fwd = self.adapter.forward(self.ids[:, start:end], self.cache, last_logits_only=last_only)
        if self.rows is not None:
            self.rows(fwd.logits, start)
        self._kept.append(fwd.features)
        self._kept_rows += end - start
        if self.keep_rows is not None:
            while self._kept and self._kept_rows - self._kept[0].shape[1] >= self.keep_rows:
                self._kept_rows -= self._kept.pop(0).shape[1]
        self._logits = fwd.logits[:, -1:]
        mx.eval(self._logits, self._kept[-1], [c.state for c in self.cache])
        self.fed = end
        return end - start

    def result(self) -> tuple[mx.array, mx.array, int]:
        """(last logits [1, 1, V], the kept features [1, n, F], index of the first kept row)."""
        if not self.done:
            raise RuntimeError(f"prefill not done: {self.fed} of {self.total} ids fed")
        return (self._logits, *self.features())

    def features(self) -> tuple[mx.array, int]:
        """The kept features of the ids fed so far [1, n, F] and the index of the first."""
        kept = self._kept
        features = mx.concatenate(kept, axis=1) if len(kept) > 1 else kept[0]
        if self.keep_rows is not None and features.shape[1] > self.keep_rows:
            features = features[:, -self.keep_rows :]
        return features, self.fed - features.shape[1]
