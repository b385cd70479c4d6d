"""DFlash (v1) and DFlash2 drafters.

A small non-causal Qwen3-style transformer that drafts a whole block in one pass. Its input is
[anchor, MASK, ...] embedded with the target's frozen table; the target's captured layer
features, fused by `fc` + `hidden_norm`, are injected as extra keys/values in every layer; the
final-normed rows go through the target's LM head. DFlash2 wraps each sublayer in a grouped
dynamic conv and re-ranks the top-K candidates with a low-rank pair selector.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from ..config import DrafterConfig
from ..errors import ParameterError
from ..sampling import SamplingParams, filtered_probs, sample
from ..target.head import TargetBinding
from .attention import ContextCache, DrafterAttention
from .conv import GroupedDynamicConv
from .selector import CandidateSelector, SelectorOutput


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, i: int):
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = DrafterAttention(
            h,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            cfg.attention_bias,
            cfg.layer_is_causal(i),
            cfg.layer_window(i),
        )
        self.mlp = MLP(h, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        if cfg.version == 2:
            self.attention_conv = GroupedDynamicConv(h, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = GroupedDynamicConv(h, cfg.conv_kernel_size, cfg.conv_group_size)
        self.conv = cfg.version == 2

    def __call__(self, x: mx.array, ctx: mx.array, rope, cache: ContextCache) -> mx.array:
        return self.forward(x, lambda u: self.self_attn(u, ctx, rope, cache))

    def forward(
        self,
        x: mx.array,
        attention: Callable[[mx.array], mx.array],
        mlp: Callable[[mx.array], mx.array] | None = None,
    ) -> mx.array:
        """The layer around any attention core (inference: cached; training: batched) and
        MLP (training may wrap its own, e.g. with dropout)."""
        x = x + self._sublayer(self.input_layernorm(x), attention, "attention_conv")
        return x + self._sublayer(self.post_attention_layernorm(x), mlp or self.mlp, "mlp_conv")

    def _sublayer(self, u: mx.array, fn: Callable, conv_name: str) -> mx.array:
        if not self.conv:
            return fn(u)
        conv: GroupedDynamicConv = getattr(self, conv_name)
        u, dyn = conv.prepare(u)
        return conv.finish(fn(u), dyn)


@dataclass(frozen=True)
class DraftVocab:
    ids: mx.array  # [N] int32 token ids
    head: Callable[[mx.array], mx.array] | None  # the target head's rows at `ids` (once bound)


@dataclass(frozen=True)
class DraftBlock:
    """One drafted block: `tokens` [γ] ids; `q` the distribution each was drawn from (None
    when greedy): [γ, V] over the whole vocabulary, or [γ, K] over `candidates` [γ, K] ids
    (DFlash2's top-K, or a draft vocabulary)."""

    tokens: mx.array
    q: mx.array | None
    candidates: mx.array | None


class Drafter(nn.Module):
    """DFlash (version 1) or DFlash2 (version 2) drafter, per `config.version`."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.layers = [DrafterLayer(config, i) for i in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        if config.version == 2:
            self.candidate_selector = CandidateSelector(
                h, config.vocab_size, config.selector_rank, config.selector_top_k
            )
        self.rope = initialize_rope(
            config.head_dim,
            config.rope_theta,
            False,
            config.rope_scaling,
            config.max_position_embeddings,
        )
        self._target: TargetBinding | None = None
        self._vocab: DraftVocab | None = None

    # ------------------------------------------------------------------ binding
    def bind(self, binding: TargetBinding) -> "Drafter":
        self._target = binding
        if self._vocab is not None:  # the restricted head reads this target's head
            self._vocab = DraftVocab(self._vocab.ids, binding.restricted(self._vocab.ids))
        return self

    def is_bound(self, binding: TargetBinding) -> bool:
        return self._target is binding

    def set_draft_vocab(self, ids: Sequence[int] | None) -> "Drafter":
        """Draft only from `ids` (None: the whole vocabulary); see drafter/vocab.py."""
        if ids is None:
            self._vocab = None
            return self
        try:
            ids = [operator.index(t) for t in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        except TypeError:
            ids = []
        n = self.config.vocab_size
        if not ids:
            raise ParameterError("a draft vocabulary is a non-empty list of token ids (ints)")
        bad = next((t for t in ids if not 0 <= t < n), None)
        if bad is not None:
            raise ParameterError(f"draft vocabulary id {bad} is outside the vocabulary [0, {n})")
        if len(set(ids)) != len(ids):  # a repeated id would count its draft mass twice
            raise ParameterError("draft vocabulary ids must be distinct")
        vocab = mx.array(ids, dtype=mx.int32)
        head = self._target.restricted(vocab) if self._target is not None else None
        self._vocab = DraftVocab(vocab, head)  # head: built by bind() when not bound yet
        return self

    @property
    def draft_vocab(self) -> mx.array | None:
        """The ids drafts may use (None: all); `draft_logits` columns follow this order."""
        return None if self._vocab is None else self._vocab.ids

    @property
    def draft_vocab_size(self) -> int | None:
        """How many ids drafts may use (None: the whole vocabulary), for reports."""
        return None if self._vocab is None else int(self._vocab.ids.size)

    @property
    def target(self) -> TargetBinding:
        if self._target is None:
            raise RuntimeError("drafter is not bound to a target (call bind())")
        return self._target

    def make_cache(self) -> list[ContextCache]:
        return [ContextCache(self.config.layer_window(i)) for i in range(len(self.layers))]

    # ------------------------------------------------------------------ forward
    def context(self, features: mx.array) -> mx.array:
        """Fused target features [B, S, N_f*H] -> context rows [B, S, H]."""
        return self.hidden_norm(self.fc(features))

    def hidden(
        self, block_ids: mx.array, features: mx.array, cache: list[ContextCache]
    ) -> mx.array:
        """Block ids [B, L] at positions cache.offset + S ..., new features [B, S, N_f*H]
        for the S positions just before the block -> final-normed hidden [B, L, H].
        Appends the new context rows to `cache`."""
        t = self.target
        x = t.embed(block_ids) * (t.embed_scale * self.config.input_embedding_scale)
        ctx = self.context(features)
        for layer, c in zip(self.layers, cache):
            x = layer(x, ctx, self.rope, c)
        return self.norm(x)

    def logits(self, hidden: mx.array) -> mx.array:
        """Logits over the whole vocabulary [..., V]."""
        return self.finish_logits(self.target.head(hidden))

    def draft_logits(self, hidden: mx.array) -> mx.array:
        """Logits over the draft vocabulary [..., N] (the whole one when none is set)."""
        if self._vocab is None:
            return self.logits(hidden)
        if self._vocab.head is None:  # its rows come from the target's head
            raise RuntimeError("drafter is not bound to a target (call bind())")
        return self.finish_logits(self._vocab.head(hidden))

    def finish_logits(self, z: mx.array) -> mx.array:
        """Head outputs -> logits: the config's output multiplier, then its final softcap (the
        one place both apply: inference and training)."""
        if self.config.output_multiplier != 1.0:
            z = z * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap:
            z = mx.tanh(z / cap) * cap
        return z

    def __call__(self, block_ids, features, cache):
        return self.logits(self.hidden(block_ids, features, cache))

    def draft_block(
        self,
        anchor: int,
        length: int,
        features: mx.array,
        cache: list[ContextCache],
        sampling: SamplingParams,
        key: mx.array | None = None,
    ) -> DraftBlock:
        """Draft `length - 1` tokens after `anchor` in one pass: [anchor, MASK, ...] over the
        new target `features` [1, S, N_f*H] of the S positions before the block (appended to
        `cache`). Greedy: argmax; else drawn from the filtered distribution (DFlash) or by the
        candidate path walk (DFlash2)."""
        block = mx.array([[anchor] + [self.config.mask_token_id] * (length - 1)])
        hidden = self.hidden(block, features, cache)[0, 1:]
        return self.finish_block(hidden, self.draft_logits(hidden), anchor, sampling, key)

    def finish_block(
        self,
        hidden: mx.array,
        logits: mx.array,
        anchor: int,
        sampling: SamplingParams,
        key: mx.array | None = None,
    ) -> DraftBlock:
        """One block's drafts from its drafted rows' hidden [γ, H] and logits [γ, N] (over the
        draft vocabulary when it has one): the path selector (DFlash2), argmax or a draw."""
        vocab = self.draft_vocab
        if self.config.version == 2:
            out = self.select(hidden, logits, mx.array(anchor), sampling.temperature, key, vocab)
            return DraftBlock(out.tokens, out.q, out.candidates)
        if sampling.greedy:
            ids = mx.argmax(logits, axis=-1)
            return DraftBlock(ids if vocab is None else vocab[ids], None, None)
        q = filtered_probs(logits, sampling)
        ids = sample(q, key)
        if vocab is None:
            return DraftBlock(ids, q, None)
        return DraftBlock(vocab[ids], q, mx.broadcast_to(vocab, q.shape))  # q: sparse over vocab

    def select(
        self,
        hidden: mx.array,
        logits: mx.array,
        anchor: mx.array,
        temperature: float = 0.0,
        key: mx.array | None = None,
        vocab: mx.array | None = None,
    ) -> SelectorOutput:
        """DFlash2 path selection for one block's drafted rows (hidden [γ, H], logits [γ, V],
        or [γ, N] over the ids `vocab`); candidates come back as token ids."""
        return self.candidate_selector.select(hidden, logits, anchor, temperature, key, vocab)
