"""Published drafter config.json files (z-lab, SpecForge), and how each should resolve.

The JSON texts are kept as text so they stay byte-comparable with their sources:

- ``Qwen3-4B-DFlash-b16``: z-lab/Qwen3-4B-DFlash-b16 as copied into third-party training
  scripts (spec S9 "copy"): v1, top-level ``block_size`` and ``rope_theta``, all full attention.
- ``Qwen3.5-27B-DFlash``: z-lab/Qwen3.5-27B-DFlash, rebuilt from the spec's field list (§2.1 says
  the public fixtures are "not verbatim"): v1, top-level ``block_size`` / ``rope_theta``,
  4 sliding + 1 full layers, window 2048, mask 248070, ids [1, 16, 31, 46, 61].
- ``Qwen3.8-27B-DFlash2``: z-lab/Qwen3.8-27B-DFlash2 @50307d4 verbatim: nested
  ``block_size`` 8, ``rope_parameters``, no top-level block_size / rope_theta / auto_map.
- ``Muse-Glimmer-30B-DFlash2``: z-lab/Muse-Glimmer-30B-DFlash2 @b54ffdd verbatim: block 16,
  ``output_multiplier`` 0.19611613513818404 and ``final_logit_softcapping`` 20.0 in dflash_config.
- ``SpecForge-qwen3-8b-dflash``: sgl-project/SpecForge configs/qwen3-8b-dflash.json verbatim:
  v1 with NO ``dflash_config`` at all (no mask token id, ids derived from num_target_layers).
"""

from __future__ import annotations

import copy
import json

QWEN3_4B_DFLASH_B16 = """{
  "architectures": [
    "DFlashDraftModel"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoModel": "dflash.DFlashDraftModel"
  },
  "block_size": 16,
  "bos_token_id": 151643,
  "dflash_config": {
    "mask_token_id": 151669,
    "target_layer_ids": [
      1,
      9,
      17,
      25,
      33
    ]
  },
  "dtype": "bfloat16",
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2560,
  "initializer_range": 0.02,
  "intermediate_size": 9728,
  "layer_types": [
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention"
  ],
  "max_position_embeddings": 40960,
  "max_window_layers": 5,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 5,
  "num_key_value_heads": 8,
  "num_target_layers": 36,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "4.57.3",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
"""

QWEN3_5_27B_DFLASH = """{
  "architectures": [
    "DFlashDraftModel"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoModel": "dflash.DFlashDraftModel"
  },
  "block_size": 16,
  "dflash_config": {
    "mask_token_id": 248070,
    "target_layer_ids": [
      1,
      16,
      31,
      46,
      61
    ]
  },
  "dtype": "bfloat16",
  "eos_token_id": 248044,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 5120,
  "initializer_range": 0.02,
  "intermediate_size": 17408,
  "layer_types": [
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention"
  ],
  "max_position_embeddings": 262144,
  "max_window_layers": 5,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 5,
  "num_key_value_heads": 8,
  "num_target_layers": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 10000000,
  "sliding_window": 2048,
  "tie_word_embeddings": false,
  "use_cache": true,
  "use_sliding_window": true,
  "vocab_size": 248320
}
"""

QWEN3_8_27B_DFLASH2 = """{
  "architectures": [
    "DFlash2DraftModel"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": null,
  "is_causal": false,
  "dflash_config": {
    "block_size": 8,
    "conv_group_size": 16,
    "conv_kernel_size": 2,
    "mask_token_id": 248070,
    "selector_rank": 256,
    "selector_top_k": 16,
    "target_layer_ids": [
      5,
      19,
      33,
      47,
      61
    ]
  },
  "dtype": "bfloat16",
  "eos_token_id": 248044,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 5120,
  "initializer_range": 0.02,
  "intermediate_size": 17408,
  "layer_types": [
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "sliding_attention"
  ],
  "max_position_embeddings": 262144,
  "max_window_layers": 5,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 5,
  "num_key_value_heads": 8,
  "num_target_layers": 64,
  "pad_token_id": 248044,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "rope_theta": 10000000,
    "rope_type": "default"
  },
  "sliding_window": 2048,
  "tie_word_embeddings": false,
  "transformers_version": "5.15.0",
  "use_cache": true,
  "use_sliding_window": true,
  "vocab_size": 248320
}
"""

MUSE_GLIMMER_30B_DFLASH2 = """{
  "architectures": [
    "DFlash2DraftModel"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 200000,
  "is_causal": false,
  "dflash_config": {
    "block_size": 16,
    "conv_group_size": 16,
    "conv_kernel_size": 2,
    "final_logit_softcapping": 20.0,
    "mask_token_id": 201818,
    "output_multiplier": 0.19611613513818404,
    "selector_rank": 256,
    "selector_top_k": 16,
    "target_layer_ids": [
      1,
      13,
      25,
      37,
      49
    ]
  },
  "dtype": "bfloat16",
  "eos_token_id": 200001,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 6656,
  "initializer_range": 0.02,
  "intermediate_size": 19968,
  "layer_types": [
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "sliding_attention",
    "sliding_attention"
  ],
  "max_position_embeddings": 131072,
  "max_window_layers": 5,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 5,
  "num_key_value_heads": 8,
  "num_target_layers": 52,
  "pad_token_id": 200018,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "rope_theta": 500000.0,
    "rope_type": "default"
  },
  "sliding_window": 2048,
  "tie_word_embeddings": false,
  "transformers_version": "5.15.0",
  "use_cache": false,
  "use_sliding_window": true,
  "vocab_size": 202048
}
"""

SPECFORGE_QWEN3_8B_DFLASH = """{
  "architectures": [
    "DFlashDraftModel"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoModel": "modeling_dflash.DFlashDraftModel"
  },
  "block_size": 16,
  "bos_token_id": 151643,
  "dtype": "bfloat16",
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "layer_types": [
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention",
    "full_attention"
  ],
  "max_position_embeddings": 40960,
  "max_window_layers": 5,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 5,
  "num_key_value_heads": 8,
  "num_target_layers": 36,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
"""

TEXTS = {
    "Qwen3-4B-DFlash-b16": QWEN3_4B_DFLASH_B16,
    "Qwen3.5-27B-DFlash": QWEN3_5_27B_DFLASH,
    "Qwen3.8-27B-DFlash2": QWEN3_8_27B_DFLASH2,
    "Muse-Glimmer-30B-DFlash2": MUSE_GLIMMER_30B_DFLASH2,
    "SpecForge-qwen3-8b-dflash": SPECFORGE_QWEN3_8B_DFLASH,
}

NAMES = tuple(TEXTS)

S, F = "sliding_attention", "full_attention"

# How each published config must resolve (from the spec, independent of the loader).
# mask None = the config carries none (must be given explicitly).
EXPECTED = {
    "Qwen3-4B-DFlash-b16": dict(
        version=1,
        block_size=16,
        rope_theta=1e6,
        layer_types=(F,) * 5,
        sliding_window=None,
        is_causal=None,
        output_multiplier=1.0,
        final_logit_softcapping=None,
        mask_token_id=151669,
        target_layer_ids=(1, 9, 17, 25, 33),
        hidden_size=2560,
        vocab_size=151936,
    ),
    "Qwen3.5-27B-DFlash": dict(
        version=1,
        block_size=16,
        rope_theta=1e7,
        layer_types=(S,) * 4 + (F,),
        sliding_window=2048,
        is_causal=None,
        output_multiplier=1.0,
        final_logit_softcapping=None,
        mask_token_id=248070,
        target_layer_ids=(1, 16, 31, 46, 61),
        hidden_size=5120,
        vocab_size=248320,
    ),
    "Qwen3.8-27B-DFlash2": dict(
        version=2,
        block_size=8,
        rope_theta=1e7,
        layer_types=(S,) * 5,
        sliding_window=2048,
        is_causal=False,
        output_multiplier=1.0,
        final_logit_softcapping=None,
        mask_token_id=248070,
        target_layer_ids=(5, 19, 33, 47, 61),
        hidden_size=5120,
        vocab_size=248320,
        conv_kernel_size=2,
        conv_group_size=16,
        selector_rank=256,
        selector_top_k=16,
    ),
    "Muse-Glimmer-30B-DFlash2": dict(
        version=2,
        block_size=16,
        rope_theta=5e5,
        layer_types=(S,) * 5,
        sliding_window=2048,
        is_causal=False,
        output_multiplier=0.19611613513818404,
        final_logit_softcapping=20.0,
        mask_token_id=201818,
        target_layer_ids=(1, 13, 25, 37, 49),
        hidden_size=6656,
        vocab_size=202048,
        conv_kernel_size=2,
        conv_group_size=16,
        selector_rank=256,
        selector_top_k=16,
    ),
    "SpecForge-qwen3-8b-dflash": dict(
        version=1,
        block_size=16,
        rope_theta=1e6,
        layer_types=(F,) * 5,
        sliding_window=None,
        is_causal=None,
        output_multiplier=1.0,
        final_logit_softcapping=None,
        mask_token_id=None,
        # no dflash_config: the reference default for 36 target layers, 5 draft layers
        target_layer_ids=(1, 9, 17, 25, 33),
        hidden_size=4096,
        vocab_size=151936,
    ),
}


def published(name: str) -> dict:
    """A fresh dict of the published config.json `name`."""
    return json.loads(TEXTS[name])


# ----------------------------------------------------------------------------- tiny copies
TINY_HIDDEN = 64  # divisible by the published conv_group_size 16
TINY_VOCAB = 96  # >= the published selector_top_k 16
TINY_LAYERS = 3
TINY_TARGET_LAYERS = 6
TINY_TARGET_IDS = [0, 1, 2, 4, 5]  # five features, like every published drafter
TINY_MASK = TINY_VOCAB - 1
TINY_WINDOW = 8
TINY_RANK = 8


def _tiny_layer_types(types: list[str]) -> list[str]:
    """Keep the pattern: the first TINY_LAYERS - 1 entries, then the last one."""
    return list(types[: TINY_LAYERS - 1]) + [types[-1]]


def tiny(name: str) -> dict:
    """The published config `name` with tiny sizes but the same schema: every field stays where
    the published file has it (top-level vs dflash_config, rope_theta vs rope_parameters, null
    vs absent), only sizes / ids / window shrink."""
    cfg = published(name)
    cfg.update(
        hidden_size=TINY_HIDDEN,
        intermediate_size=2 * TINY_HIDDEN,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=TINY_VOCAB,
        num_hidden_layers=TINY_LAYERS,
        num_target_layers=TINY_TARGET_LAYERS,
    )
    if "max_window_layers" in cfg:
        cfg["max_window_layers"] = TINY_LAYERS
    if "layer_types" in cfg:
        cfg["layer_types"] = _tiny_layer_types(cfg["layer_types"])
    if cfg.get("sliding_window") is not None:
        cfg["sliding_window"] = TINY_WINDOW
    for tok in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if cfg.get(tok) is not None:
            cfg[tok] = 0
    dflash = cfg.get("dflash_config")
    if dflash is not None:
        if "target_layer_ids" in dflash:
            dflash["target_layer_ids"] = list(TINY_TARGET_IDS)
        if dflash.get("mask_token_id") is not None:
            dflash["mask_token_id"] = TINY_MASK
        if "selector_rank" in dflash:
            dflash["selector_rank"] = TINY_RANK
    return cfg


def tiny_expected(name: str) -> dict:
    """EXPECTED[name] with the tiny sizes substituted."""
    exp = copy.deepcopy(EXPECTED[name])
    exp["layer_types"] = tuple(_tiny_layer_types(list(exp["layer_types"])))
    exp["hidden_size"], exp["vocab_size"] = TINY_HIDDEN, TINY_VOCAB
    if exp["sliding_window"] is not None:
        exp["sliding_window"] = TINY_WINDOW
    if exp["mask_token_id"] is not None:
        exp["mask_token_id"] = TINY_MASK
    if name == "SpecForge-qwen3-8b-dflash":
        exp["target_layer_ids"] = (1, 2, 3)  # reference default for 6 target, 3 draft layers
    else:
        exp["target_layer_ids"] = tuple(TINY_TARGET_IDS)
    if "selector_rank" in exp:
        exp["selector_rank"] = TINY_RANK
    return exp
