"""Tiny random-initialised targets and drafters for tests (real MLX models, seconds to build)."""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from dflash2_mlx.config import DrafterConfig
from dflash2_mlx.drafter.model import Drafter

VOCAB = 96
HIDDEN = 64


# Other mlx-lm families, by the fields their ModelArgs needs beyond the common ones.
OTHER_FAMILIES = {
    # hybrid: each layer's cache is a CacheList of an attention KV cache and a Mamba2 state
    "falcon_h1": dict(
        head_dim=16,
        mamba_d_ssm=64,
        mamba_d_head=16,
        mamba_n_heads=4,
        mamba_d_state=8,
        mamba_chunk_size=16,
        rope_theta=10000.0,
    ),
    # a state-space model without a transformer decoder: refused
    "mamba": dict(
        state_size=8, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=8
    ),
    # 5-D grouped attention scores, soft-capped logits
    "gemma2": dict(
        head_dim=16,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    ),
}


def make_target(
    family: str = "llama",
    seed: int = 0,
    vocab: int = VOCAB,
    layers: int = 4,
    hidden: int = HIDDEN,
    **extra,
):
    """A random-weight mlx-lm model of `family` (llama, qwen3, qwen3_5 or OTHER_FAMILIES), in
    fp32."""
    mx.random.seed(seed)
    common = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=vocab,
        tie_word_embeddings=extra.pop("tie_word_embeddings", True),
    )
    if family == "llama":
        from mlx_lm.models import llama

        model = llama.Model(
            llama.ModelArgs(model_type="llama", rope_theta=10000.0, **common, **extra)
        )
    elif family == "qwen3":
        from mlx_lm.models import qwen3

        model = qwen3.Model(
            qwen3.ModelArgs(
                model_type="qwen3",
                head_dim=hidden // 4,
                rope_theta=10000.0,
                max_position_embeddings=4096,
                **common,
                **extra,
            )
        )
    elif family == "qwen3_5":
        from mlx_lm.models import qwen3_5

        text = dict(
            common,
            model_type="qwen3_5_text",
            head_dim=hidden // 4,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            full_attention_interval=2,
            max_position_embeddings=4096,
            rope_parameters={
                "type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
            **extra,
        )
        model = qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=text))
    elif family in OTHER_FAMILIES:
        import importlib

        module = importlib.import_module(f"mlx_lm.models.{family}")
        fields = dict(common, model_type=family, **OTHER_FAMILIES[family], **extra)
        model = module.Model(module.ModelArgs.from_dict(fields))
    else:
        raise ValueError(family)
    # Sharpen the random weights a little so greedy argmaxes are well separated.
    model.update(tree_map(lambda p: p * 2.0 if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model


def drafter_config(
    version: int = 2,
    *,
    block_size: int = 16,
    layer_ids=(0, 2),
    vocab: int = VOCAB,
    hidden: int = HIDDEN,
    layers: int = 2,
    layer_types=None,
    sliding_window=None,
    is_causal=None,
    mask_token_id: int = VOCAB - 1,
    top_k: int = 16,
    **extra,
) -> DrafterConfig:
    raw = {
        "architectures": ["DFlash2DraftModel" if version == 2 else "DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "num_target_layers": 4,
        "dflash_config": {
            "block_size": block_size,
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(layer_ids),
        },
    }
    if version == 2:
        raw["dflash_config"].update(
            conv_kernel_size=2,
            conv_group_size=16,
            selector_rank=8,
            selector_top_k=min(top_k, vocab),
        )
    if layer_types is not None:
        raw["layer_types"] = list(layer_types)
    if sliding_window is not None:
        raw["sliding_window"] = sliding_window
    if is_causal is not None:
        raw["is_causal"] = is_causal
    raw.update(extra)
    return DrafterConfig.from_dict(raw, "tiny config")


def make_drafter(version: int = 2, seed: int = 1, randomize_v2: bool = True, **kw) -> Drafter:
    """A random drafter; v2 parts get non-trivial random values (not the identity init)."""
    mx.random.seed(seed)
    d = Drafter(drafter_config(version, **kw))
    if version == 2 and randomize_v2:
        params = dict(tree_flatten(d.parameters()))
        upd = {}
        for name, p in params.items():
            if "base_kernel" in name or "kernel_projection" in name or "codebook" in name:
                upd[name] = p + 0.3 * mx.random.normal(p.shape)
        d.load_weights(list(upd.items()), strict=False)
    mx.eval(d.parameters())
    return d


def greedy_reference(
    model, prompt: list[int], max_tokens: int, eos: set[int] = frozenset()
) -> list[int]:
    """Plain greedy decoding, one token per forward: the ground truth."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)
    out: list[int] = []
    while len(out) < max_tokens:
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        if tok in eos:
            break
        logits = model(mx.array([[tok]]), cache=cache)
    return out


def fit_drafter(
    target,
    drafter: Drafter,
    prompts: list[list[int]],
    steps: int = 200,
    gen_tokens: int = 48,
    lr: float = 3e-3,
    seed: int = 0,
) -> Drafter:
    """Distil `drafter` on the target's own greedy continuations (a few seconds), so that
    tests see accepted drafts, not only rejections. Uses the inference forward path."""
    import random

    import mlx.nn as nn
    import mlx.optimizers as optim

    from dflash2_mlx.target.adapter import TargetAdapter

    adapter = TargetAdapter(target, drafter.config.target_layer_ids)
    drafter.bind(adapter.binding())
    seqs = []
    for p in prompts:
        seq = p + greedy_reference(target, p, gen_tokens)
        fwd = adapter.forward(mx.array(seq)[None], adapter.make_cache())
        seqs.append((seq, fwd.features))
    block, mask = drafter.config.block_size, drafter.config.mask_token_id
    rng = random.Random(seed)

    def loss_fn(model, ids, feats, labels):
        logits = model(ids, feats, model.make_cache())[0, 1:]
        return nn.losses.cross_entropy(logits, labels).mean()

    grad_fn = nn.value_and_grad(drafter, loss_fn)
    opt = optim.Adam(learning_rate=lr)
    for _ in range(steps):
        seq, feats = rng.choice(seqs)
        a = rng.randrange(1, len(seq) - block)
        ids = mx.array([[seq[a]] + [mask] * (block - 1)])
        labels = mx.array(seq[a + 1 : a + block])
        _, grads = grad_fn(drafter, ids, feats[:, :a], labels)
        opt.update(drafter, grads)
        mx.eval(drafter.parameters(), opt.state)
    return drafter
