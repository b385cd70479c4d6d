"""Checkpoint loading / saving against the published config.json schemas (tests/published_configs.py).

Every published config is shrunk to tiny sizes with its schema intact, written as an official
folder (config.json + model.safetensors with the official tensor names and shapes), loaded,
checked field by field, saved and reloaded. Every user-facing error is provoked and its message
checked for the file / tensor / field it concerns and for the expected and found values.
"""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from dflash2_mlx import checkpoint
from dflash2_mlx.api import Pair, check_compatible
from dflash2_mlx.checkpoint import WEIGHTS_NAME, load_drafter, save_drafter
from dflash2_mlx.config import DrafterConfig
from dflash2_mlx.errors import CheckpointError, CompatibilityError, ConfigError, DFlash2Error
from dflash2_mlx.target.adapter import TargetAdapter

import published_configs as pc
from tiny import make_target

PROMPT = [3, 17, 42, 5, 88, 23, 61, 9, 30, 74, 12, 50]  # longer than TINY_WINDOW


# ----------------------------------------------------------------------------- helpers
def _config(cfg: dict, mask_token_id: int | None = None) -> DrafterConfig:
    return DrafterConfig.from_dict(cfg, "test config", mask_token_id=mask_token_id)


def random_weights(cfg: DrafterConfig, seed: int = 0, dtype=mx.bfloat16) -> dict[str, mx.array]:
    """Random tensors for every official key, in the official shapes."""
    mx.random.seed(seed)
    out = {}
    for name, shape in checkpoint.expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * mx.random.normal(shape)
        else:
            value = 0.1 * mx.random.normal(shape)
        out[name] = value.astype(dtype)
    mx.eval(out)
    return out


def write_folder(
    folder: Path,
    cfg: dict,
    weights: dict[str, mx.array] | None = None,
    *,
    mask_token_id: int | None = None,
    seed: int = 0,
) -> dict[str, mx.array]:
    """config.json + model.safetensors; returns the tensors written."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if weights is None:
        weights = random_weights(_config(cfg, mask_token_id), seed)
    mx.save_safetensors(str(folder / WEIGHTS_NAME), weights)
    return weights


def params(model) -> dict[str, mx.array]:
    return dict(tree_flatten(model.parameters()))


def same_tensors(a: dict[str, mx.array], b: dict[str, mx.array]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].shape == b[name].shape, name
        assert a[name].dtype == b[name].dtype, name
        assert mx.array_equal(a[name], b[name]).item(), name


def draft(drafter, target):
    """Bind `drafter` to `target`, run one block over PROMPT's features.
    Returns (hidden, logits, expected logits from the spec's head formula)."""
    pair = Pair.from_models(target, None, drafter)
    adapter = pair.decoder.target
    fwd = adapter.forward(mx.array([PROMPT]), adapter.make_cache())
    cfg = drafter.config
    block = mx.array([[PROMPT[-1]] + [cfg.mask_token_id] * (cfg.block_size - 1)])
    hidden = drafter.hidden(block, fwd.features, drafter.make_cache())
    logits = drafter.logits(hidden)
    z = adapter.head(hidden) * cfg.output_multiplier
    if cfg.final_logit_softcapping:
        z = mx.tanh(z / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    mx.eval(hidden, logits, z)
    return hidden, logits, z


def raises(exc_type, fn, *args, **kwargs) -> str:
    """Call fn, demand a DFlash2Error of exc_type, return its message."""
    with pytest.raises(DFlash2Error) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, exc_type), f"{type(info.value).__name__}: {info.value}"
    return str(info.value)


@pytest.fixture(scope="module")
def target():
    return make_target(
        "qwen3", vocab=pc.TINY_VOCAB, hidden=pc.TINY_HIDDEN, layers=pc.TINY_TARGET_LAYERS
    )


@pytest.fixture()
def v2_folder(tmp_path):
    """A valid tiny Qwen3.8-27B-DFlash2-schema folder and its tensors."""
    folder = tmp_path / "v2"
    weights = write_folder(folder, pc.tiny("Qwen3.8-27B-DFlash2"))
    return folder, weights


def _check_resolved(cfg: DrafterConfig, exp: dict) -> None:
    assert cfg.version == exp["version"]
    assert cfg.architecture == ("DFlash2DraftModel" if exp["version"] == 2 else "DFlashDraftModel")
    assert cfg.block_size == exp["block_size"]
    assert cfg.rope_theta == exp["rope_theta"]
    assert cfg.layer_types == exp["layer_types"]
    assert cfg.sliding_window == exp["sliding_window"]
    assert cfg.is_causal == exp["is_causal"]
    assert cfg.output_multiplier == exp["output_multiplier"]
    assert cfg.final_logit_softcapping == exp["final_logit_softcapping"]
    assert cfg.target_layer_ids == exp["target_layer_ids"]
    assert cfg.hidden_size == exp["hidden_size"]
    assert cfg.vocab_size == exp["vocab_size"]
    assert cfg.input_embedding_scale == 1.0
    if exp["mask_token_id"] is not None:
        assert cfg.mask_token_id == exp["mask_token_id"]
    for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        assert getattr(cfg, name) == exp.get(name, 0), name
    # Reference causality rule: explicit is_causal, else causal iff the layer slides.
    for i, kind in enumerate(exp["layer_types"]):
        causal = exp["is_causal"] if exp["is_causal"] is not None else kind == pc.S
        assert cfg.layer_is_causal(i) == causal
        assert cfg.layer_window(i) == (exp["sliding_window"] if kind == pc.S else None)


# ----------------------------------------------------------------------------- 1. counts
def test_qwen38_dflash2_parameter_count_without_allocation():
    cfg = _config(pc.published("Qwen3.8-27B-DFlash2"))
    shapes = checkpoint.expected_shapes(cfg)
    assert checkpoint.parameter_count(cfg) == 1_924_404_480  # the published BF16 parameter count
    assert len(shapes) == 81
    assert sum(math.prod(s) for s in shapes.values()) == 1_924_404_480
    # its breakdown
    assert shapes["fc.weight"] == (5120, 5 * 5120)
    assert shapes["layers.0.attention_conv.base_kernel"] == (2, 2, 5120)
    assert shapes["layers.0.mlp_conv.kernel_projection.weight"] == (2 * 2 * 320, 5120)
    assert shapes["candidate_selector.predecessor_codebook"] == (248320, 256)
    assert shapes["candidate_selector.successor_codebook"] == (248320, 256)
    assert "candidate_selector.predecessor_codebook.weight" not in shapes
    assert not any("embed_tokens" in k or "lm_head" in k for k in shapes)


def test_muse_glimmer_shapes_match_published_safetensors_header():
    """Spot checks against z-lab's published safetensors header of the Muse drafter."""
    shapes = checkpoint.expected_shapes(_config(pc.published("Muse-Glimmer-30B-DFlash2")))
    assert len(shapes) == 81
    assert shapes["fc.weight"] == (6656, 33280)
    assert shapes["candidate_selector.hidden_projection.weight"] == (256, 6656)
    assert shapes["candidate_selector.predecessor_codebook"] == (202048, 256)
    assert shapes["layers.4.attention_conv.kernel_projection.weight"] == (1664, 6656)
    assert shapes["layers.4.mlp_conv.base_kernel"] == (2, 2, 6656)
    assert shapes["layers.4.self_attn.q_proj.weight"] == (4096, 6656)
    assert shapes["layers.4.self_attn.k_proj.weight"] == (1024, 6656)
    assert shapes["layers.4.self_attn.o_proj.weight"] == (6656, 4096)
    assert shapes["layers.4.mlp.down_proj.weight"] == (6656, 19968)


def test_v1_tensor_list():
    shapes = checkpoint.expected_shapes(_config(pc.published("Qwen3-4B-DFlash-b16")))
    assert len(shapes) == 3 + 5 * 11
    assert shapes["fc.weight"] == (2560, 5 * 2560)
    assert not any("conv" in k or "selector" in k for k in shapes)


# ----------------------------------------------------------------------------- 2. schemas
@pytest.mark.parametrize("name", pc.NAMES)
def test_published_config_resolves(name):
    exp = pc.EXPECTED[name]
    mask = 7 if exp["mask_token_id"] is None else None
    cfg = _config(pc.published(name), mask_token_id=mask)
    _check_resolved(cfg, exp)
    if mask is not None:
        assert cfg.mask_token_id == mask


@pytest.mark.parametrize("name", pc.NAMES)
def test_tiny_published_schema_load_save_roundtrip(name, tmp_path, target):
    exp = pc.tiny_expected(name)
    needs_mask = exp["mask_token_id"] is None
    mask = pc.TINY_MASK if needs_mask else None
    src = tmp_path / "src"
    written = write_folder(src, pc.tiny(name), mask_token_id=mask, seed=pc.NAMES.index(name))

    if needs_mask:  # no dflash_config.mask_token_id in this schema
        msg = raises(ConfigError, load_drafter, src)
        assert "mask_token_id" in msg and str(src / "config.json") in msg
    d1 = load_drafter(src, mask_token_id=mask)
    _check_resolved(d1.config, exp)
    assert d1.config.mask_token_id == pc.TINY_MASK
    same_tensors(params(d1), written)

    # save -> official format
    out = tmp_path / "saved"
    save_drafter(d1, out)
    saved = json.loads((out / "config.json").read_text())
    dflash = saved["dflash_config"]
    assert saved["architectures"] == [d1.config.architecture]
    assert dflash["block_size"] == exp["block_size"]
    assert dflash["mask_token_id"] == pc.TINY_MASK
    assert dflash["target_layer_ids"] == list(exp["target_layer_ids"])
    for legacy in ("mask_token_id", "target_layer_ids"):
        assert legacy not in saved, legacy
    if exp["version"] == 2:
        for field in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            assert dflash[field] == exp[field]
            assert field not in saved
    if exp["output_multiplier"] != 1.0:
        assert dflash["output_multiplier"] == exp["output_multiplier"]
    if exp["final_logit_softcapping"] is not None:
        assert dflash["final_logit_softcapping"] == exp["final_logit_softcapping"]
    assert saved["layer_types"] == list(exp["layer_types"])
    if exp["sliding_window"] is not None:
        assert saved["sliding_window"] == exp["sliding_window"]
    if exp["is_causal"] is not None:
        assert saved["is_causal"] == exp["is_causal"]
    assert saved["hidden_size"] == pc.TINY_HIDDEN and saved["vocab_size"] == pc.TINY_VOCAB
    # unknown fields of the published file survive
    source = pc.tiny(name)
    for key in (
        "model_type",
        "max_position_embeddings",
        "num_target_layers",
        "auto_map",
        "eos_token_id",
        "initializer_range",
        "tie_word_embeddings",
    ):
        if key in source:
            assert saved[key] == source[key], key
    assert saved["dtype"] == "bfloat16"

    # the saved tensors are the official names and the loaded values
    on_disk = mx.load(str(out / WEIGHTS_NAME))
    same_tensors(on_disk, written)

    # reload (no mask needed any more) -> same config, same tensors, same logits
    d2 = load_drafter(out)
    _check_resolved(d2.config, exp)
    assert d2.config.mask_token_id == pc.TINY_MASK
    same_tensors(params(d2), written)

    h1, l1, z1 = draft(d1, target)
    h2, l2, z2 = draft(d2, target)
    assert l1.shape == (1, exp["block_size"], pc.TINY_VOCAB)
    assert mx.array_equal(l1, l2).item()
    # the head honours output_multiplier and final_logit_softcapping
    assert mx.allclose(l1, z1, rtol=1e-5, atol=1e-5).item()
    if exp["final_logit_softcapping"] is not None:
        assert mx.max(mx.abs(l1)).item() <= exp["final_logit_softcapping"]
    if exp["version"] == 2:
        sel1 = d1.select(h1[0, 1:], l1[0, 1:], mx.array(PROMPT[-1]))
        sel2 = d2.select(h2[0, 1:], l2[0, 1:], mx.array(PROMPT[-1]))
        assert mx.array_equal(sel1.tokens, sel2.tokens).item()
        assert mx.array_equal(sel1.candidates, sel2.candidates).item()


@pytest.mark.parametrize(
    "name", ["Qwen3-4B-DFlash-b16", "Qwen3.5-27B-DFlash", "SpecForge-qwen3-8b-dflash"]
)
def test_saved_v1_config_keeps_v1_readers_fields(name, tmp_path):
    """A saved v1 drafter keeps the fields its published schema declares at the top level:
    v1 readers (z-lab's HF remote code named by the kept `auto_map`, transformers 4.x Qwen3Config
    named by the kept `transformers_version`) read `config.block_size` and `config.rope_theta`
    there; moving them only into dflash_config / rope_parameters makes those readers fail
    (block_size) or silently fall back to rope_theta 10000."""
    mask = pc.TINY_MASK if pc.EXPECTED[name]["mask_token_id"] is None else None
    src = tmp_path / "src"
    write_folder(src, pc.tiny(name), mask_token_id=mask)
    out = tmp_path / "saved"
    save_drafter(load_drafter(src, mask_token_id=mask), out)
    saved = json.loads((out / "config.json").read_text())
    exp = pc.EXPECTED[name]
    assert saved.get("block_size") == exp["block_size"], "top-level block_size dropped"
    assert saved.get("rope_theta") == exp["rope_theta"], "top-level rope_theta dropped"


def test_model_prefix_keys_load(v2_folder, tmp_path):
    folder, weights = v2_folder
    prefixed = tmp_path / "prefixed"
    write_folder(
        prefixed, pc.tiny("Qwen3.8-27B-DFlash2"), {f"model.{k}": v for k, v in weights.items()}
    )
    d = load_drafter(prefixed)
    same_tensors(params(d), weights)


def test_weight_suffixed_codebooks_load(v2_folder, tmp_path):
    folder, weights = v2_folder
    renamed = {(k + ".weight" if k.endswith("_codebook") else k): v for k, v in weights.items()}
    assert "candidate_selector.successor_codebook.weight" in renamed
    both = tmp_path / "suffixed"
    write_folder(both, pc.tiny("Qwen3.8-27B-DFlash2"), renamed)
    d = load_drafter(both)
    same_tensors(params(d), weights)
    # and with a model. prefix on top
    both2 = tmp_path / "prefixed_suffixed"
    write_folder(
        both2, pc.tiny("Qwen3.8-27B-DFlash2"), {f"model.{k}": v for k, v in renamed.items()}
    )
    same_tensors(params(load_drafter(both2)), weights)


def test_sharded_checkpoint_loads(v2_folder, tmp_path):
    folder, weights = v2_folder
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((folder / "config.json").read_text())
    names = sorted(weights)
    half = len(names) // 2
    mx.save_safetensors(
        str(sharded / "model-00001-of-00002.safetensors"), {k: weights[k] for k in names[:half]}
    )
    mx.save_safetensors(
        str(sharded / "model-00002-of-00002.safetensors"), {k: weights[k] for k in names[half:]}
    )
    same_tensors(params(load_drafter(sharded)), weights)


def test_load_and_save_with_dtype(v2_folder, tmp_path):
    folder, weights = v2_folder
    d = load_drafter(folder, dtype=mx.float32)
    same_tensors(params(d), {k: v.astype(mx.float32) for k, v in weights.items()})
    save_drafter(d, tmp_path / "bf16", dtype=mx.bfloat16)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    same_tensors(mx.load(str(tmp_path / "bf16" / WEIGHTS_NAME)), weights)


def test_explicit_mask_token_id_overrides_config(v2_folder):
    folder, _ = v2_folder
    assert load_drafter(folder, mask_token_id=3).config.mask_token_id == 3


# ----------------------------------------------------------------------------- 3. errors
def test_error_unknown_architecture(tmp_path):
    cfg = pc.tiny("Qwen3.8-27B-DFlash2")
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    write_folder(tmp_path / "d", cfg, random_weights(_config(pc.tiny("Qwen3.8-27B-DFlash2"))))
    msg = raises(ConfigError, load_drafter, tmp_path / "d")
    assert str(tmp_path / "d" / "config.json") in msg
    assert "Qwen3ForCausalLM" in msg
    assert "DFlashDraftModel" in msg and "DFlash2DraftModel" in msg


def test_error_missing_tensor(v2_folder, tmp_path):
    _, weights = v2_folder
    gone = "layers.1.mlp_conv.kernel_projection.weight"
    write_folder(
        tmp_path / "d",
        pc.tiny("Qwen3.8-27B-DFlash2"),
        {k: v for k, v in weights.items() if k != gone},
    )
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "missing" in msg and repr(gone) in msg and str(tmp_path / "d") in msg


def test_error_a_tensor_in_two_files(v2_folder, tmp_path):
    """A stray export beside the weights (zz-old.safetensors) used to replace the tensors it
    shares with them, silently (the last file in name order won)."""
    _, weights = v2_folder
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), weights)
    stray = {
        "norm.weight": mx.zeros_like(weights["norm.weight"]),
        "fc.weight": weights["fc.weight"],
    }
    mx.save_safetensors(str(tmp_path / "d" / "zz-old.safetensors"), stray)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "'fc.weight'" in msg and "zz-old.safetensors" in msg and "1 more" in msg


def test_error_missing_many_tensors_is_summarised(v2_folder, tmp_path):
    _, weights = v2_folder
    kept = {k: v for k, v in weights.items() if not k.startswith("layers.")}
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), kept)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "missing" in msg and "more" in msg and len(msg) < 1000


def test_error_unexpected_tensor(v2_folder, tmp_path):
    _, weights = v2_folder
    extra = dict(weights, **{"lm_head.weight": mx.zeros((pc.TINY_VOCAB, pc.TINY_HIDDEN))})
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), extra)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "unexpected" in msg and "'lm_head.weight'" in msg and str(tmp_path / "d") in msg


@pytest.mark.parametrize("dtype", [mx.uint8, mx.int8, mx.int32, mx.bool_])
def test_error_weights_of_no_float_dtype(v2_folder, tmp_path, dtype):
    """FP8 safetensors read as uint8 (and int weights) cast by value would be noise: a
    drafter that loads but never drafts right. Refused, naming the tensor."""
    _, weights = v2_folder
    bad = dict(weights)
    bad["fc.weight"] = weights["fc.weight"].astype(dtype)
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), bad)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "'fc.weight'" in msg and str(dtype).removeprefix("mlx.core.") in msg
    assert "float32, float16 or bfloat16" in msg


def test_error_a_quantized_drafter_is_named_so(v2_folder, tmp_path):
    _, weights = v2_folder
    q = dict(weights)
    w = weights["fc.weight"].astype(mx.float32)
    q["fc.weight"], q["fc.scales"], q["fc.biases"] = mx.quantize(w, group_size=32, bits=4)
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), q)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "quantized drafter" in msg and "'fc.biases'" in msg and "unquantized" in msg


def test_error_v2_tensors_in_a_v1_checkpoint(tmp_path):
    """A DFlash2 checkpoint whose config says DFlash (v1): the v2 tensors are named."""
    v2cfg = _config(pc.tiny("Qwen3.8-27B-DFlash2"))
    cfg = pc.tiny("Qwen3.8-27B-DFlash2")
    cfg["architectures"] = ["DFlashDraftModel"]
    write_folder(tmp_path / "d", cfg, random_weights(v2cfg))
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "unexpected" in msg and "candidate_selector" in msg and "DFlashDraftModel" in msg


def test_error_shape_mismatch(v2_folder, tmp_path):
    _, weights = v2_folder
    bad = dict(weights)
    bad["layers.0.self_attn.k_proj.weight"] = mx.zeros((48, pc.TINY_HIDDEN), dtype=mx.bfloat16)
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), bad)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "'layers.0.self_attn.k_proj.weight'" in msg
    assert "[48, 64]" in msg and "[32, 64]" in msg
    assert msg.index("[48, 64]") < msg.index("expected") < msg.index("[32, 64]")


def test_error_codebook_shape_mismatch(v2_folder, tmp_path):
    _, weights = v2_folder
    bad = dict(weights)
    bad["candidate_selector.successor_codebook"] = mx.zeros((pc.TINY_VOCAB, 4), dtype=mx.bfloat16)
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), bad)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "'candidate_selector.successor_codebook'" in msg
    assert f"[{pc.TINY_VOCAB}, 4]" in msg and f"[{pc.TINY_VOCAB}, {pc.TINY_RANK}]" in msg


def test_error_duplicate_tensor_spellings(v2_folder, tmp_path):
    _, weights = v2_folder
    dup = dict(weights)
    dup["model.norm.weight"] = weights["norm.weight"]
    write_folder(tmp_path / "d", pc.tiny("Qwen3.8-27B-DFlash2"), dup)
    msg = raises(CheckpointError, load_drafter, tmp_path / "d")
    assert "norm.weight" in msg and "twice" in msg


def test_error_config_json_missing(v2_folder):
    folder, _ = v2_folder
    (folder / "config.json").unlink()
    msg = raises(CheckpointError, load_drafter, folder)
    assert "config.json" in msg and str(folder) in msg


def test_error_invalid_json_names_line(v2_folder):
    folder, _ = v2_folder
    text = json.dumps(pc.tiny("Qwen3.8-27B-DFlash2"), indent=2)
    lines = text.splitlines()
    bad_line = next(i for i, line in enumerate(lines) if '"hidden_size"' in line)
    lines[bad_line] = lines[bad_line].rstrip(",")  # drop a comma -> error on the next line
    (folder / "config.json").write_text("\n".join(lines) + "\n")
    msg = raises(ConfigError, load_drafter, folder)
    assert str(folder / "config.json") in msg
    assert "invalid JSON" in msg and f"line {bad_line + 2}" in msg


def test_error_config_not_an_object(v2_folder):
    folder, _ = v2_folder
    (folder / "config.json").write_text("[1, 2]\n")
    msg = raises(ConfigError, load_drafter, folder)
    assert "object" in msg and "list" in msg


def test_error_missing_mask_token_id_and_explicit_fix(v2_folder):
    folder, weights = v2_folder
    cfg = pc.tiny("Qwen3.8-27B-DFlash2")
    del cfg["dflash_config"]["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(cfg))
    msg = raises(ConfigError, load_drafter, folder)
    assert "mask_token_id" in msg and str(folder / "config.json") in msg
    d = load_drafter(folder, mask_token_id=pc.TINY_MASK)
    assert d.config.mask_token_id == pc.TINY_MASK
    same_tensors(params(d), weights)
    # the fix it names works for every front end (no flag takes the id): the config's field
    assert '"dflash_config": {"mask_token_id": N}' in msg
    cfg["dflash_config"]["mask_token_id"] = pc.TINY_MASK
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_drafter(folder).config.mask_token_id == pc.TINY_MASK


def test_error_mask_token_id_outside_vocab(v2_folder):
    folder, _ = v2_folder
    msg = raises(ConfigError, load_drafter, folder, mask_token_id=pc.TINY_VOCAB + 5)
    assert str(pc.TINY_VOCAB + 5) in msg and str(pc.TINY_VOCAB) in msg


def _config_error(tmp_path, mutate, source="Qwen3.8-27B-DFlash2") -> str:
    cfg = pc.tiny(source)
    mutate(cfg)
    folder = tmp_path / "cfg_err"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    msg = raises(ConfigError, load_drafter, folder)
    assert str(folder / "config.json") in msg
    return msg


def test_error_layer_types_length(tmp_path):
    msg = _config_error(tmp_path, lambda c: c["layer_types"].append("sliding_attention"))
    assert "layer_types" in msg and "4" in msg and f"num_hidden_layers = {pc.TINY_LAYERS}" in msg


def test_error_unknown_layer_type(tmp_path):
    def mutate(c):
        c["layer_types"][0] = "linear_attention"

    msg = _config_error(tmp_path, mutate)
    assert "linear_attention" in msg and "full_attention" in msg


def test_error_sliding_without_window(tmp_path):
    msg = _config_error(tmp_path, lambda c: c.pop("sliding_window"))
    assert "sliding_window" in msg and "None" in msg
    # published v1 schema with an explicit null window
    msg = _config_error(
        tmp_path / "null", lambda c: c.update(sliding_window=None), "Qwen3.5-27B-DFlash"
    )
    assert "sliding_window" in msg and "None" in msg


@pytest.mark.parametrize(
    "field", ["selector_top_k", "selector_rank", "conv_kernel_size", "conv_group_size"]
)
def test_error_v2_field_missing(tmp_path, field):
    msg = _config_error(tmp_path, lambda c: c["dflash_config"].pop(field))
    assert f"'{field}'" in msg and "missing" in msg


def test_error_conv_kernel_larger_than_block(tmp_path):
    msg = _config_error(tmp_path, lambda c: c["dflash_config"].update(conv_kernel_size=9))
    assert "conv_kernel_size" in msg and "9" in msg and "block_size" in msg and "8" in msg


def test_error_hidden_not_divisible_by_conv_group(tmp_path):
    msg = _config_error(tmp_path, lambda c: c["dflash_config"].update(conv_group_size=24))
    assert "hidden_size" in msg and "64" in msg and "conv_group_size" in msg and "24" in msg


def test_error_selector_top_k_out_of_range(tmp_path):
    msg = _config_error(tmp_path, lambda c: c["dflash_config"].update(selector_top_k=1000))
    assert "selector_top_k" in msg and "1000" in msg


def test_error_field_wrong_type(tmp_path):
    msg = _config_error(tmp_path, lambda c: c.update(hidden_size="5120"))
    assert "'hidden_size'" in msg and "'5120'" in msg and "int" in msg


def test_error_required_field_missing(tmp_path):
    msg = _config_error(tmp_path, lambda c: c.pop("intermediate_size"))
    assert "'intermediate_size'" in msg and "missing" in msg


def test_error_heads_not_multiple_of_kv_heads(tmp_path):
    msg = _config_error(tmp_path, lambda c: c.update(num_key_value_heads=3))
    assert "num_attention_heads (4)" in msg and "num_key_value_heads (3)" in msg


def test_error_target_layer_ids_missing_without_num_target_layers(tmp_path):
    def mutate(c):
        c.pop("num_target_layers")

    msg = _config_error(tmp_path, mutate, "SpecForge-qwen3-8b-dflash")
    assert "target_layer_ids" in msg and "num_target_layers" in msg


def test_error_bad_target_layer_ids(tmp_path):
    msg = _config_error(tmp_path, lambda c: c["dflash_config"].update(target_layer_ids=[0, -1]))
    assert "target_layer_ids" in msg and "-1" in msg


MALFORMED = [
    # (schema, field path, value, text the message must contain)
    (
        "Qwen3.8-27B-DFlash2",
        ("rope_parameters",),
        {"rope_type": "no-such-rope", "rope_theta": 1e4},
        "no-such-rope",
    ),
    (
        "Qwen3.8-27B-DFlash2",
        ("rope_parameters",),
        {"rope_type": "yarn", "rope_theta": 1e4},
        "factor",
    ),
    ("Qwen3.8-27B-DFlash2", ("rope_parameters",), ["rope_theta", 1e4], "rope_parameters"),
    ("Qwen3-4B-DFlash-b16", ("rope_scaling",), "linear", "rope_scaling"),
    ("Qwen3-4B-DFlash-b16", ("rope_theta",), "fast", "rope_theta"),
    ("Qwen3.8-27B-DFlash2", ("rms_norm_eps",), 0.0, "rms_norm_eps"),
    ("Qwen3.8-27B-DFlash2", ("layer_types",), 5, "layer_types"),
    ("Qwen3.8-27B-DFlash2", ("layer_types",), ["full_attention", 1, "x"], "layer_types"),
    # a string "false" must not silently make every layer causal
    ("Qwen3.8-27B-DFlash2", ("is_causal",), "false", "is_causal"),
]


@pytest.mark.parametrize(
    "schema,path,value,needle", MALFORMED, ids=[f"{p[-1]}={v!r}" for _, p, v, _ in MALFORMED]
)
def test_error_malformed_value_is_a_config_error(tmp_path, schema, path, value, needle):
    """Malformed config values must be a ConfigError naming the field, not a raw
    ValueError / KeyError / TypeError / AttributeError from model construction, and never
    silently accepted."""
    folder = tmp_path / "cfg_err"
    cfg = pc.tiny(schema)
    cfg[path[0]] = value
    write_folder(folder, cfg, random_weights(_config(pc.tiny(schema), 5)))
    msg = raises(ConfigError, load_drafter, folder, mask_token_id=5)
    assert needle in msg and str(folder / "config.json") in msg


def test_error_no_safetensors(v2_folder):
    folder, _ = v2_folder
    (folder / WEIGHTS_NAME).unlink()
    msg = raises(CheckpointError, load_drafter, folder)
    assert "safetensors" in msg and str(folder) in msg


def test_error_corrupt_safetensors(v2_folder):
    folder, _ = v2_folder
    (folder / WEIGHTS_NAME).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    msg = raises(CheckpointError, load_drafter, folder)
    assert str(folder / WEIGHTS_NAME) in msg


# --------------------------------------------------------------- drafter <-> target mismatch
def _load_tiny(tmp_path, name="Qwen3.8-27B-DFlash2", **changes):
    cfg = pc.tiny(name)
    dflash = changes.pop("dflash", {})
    cfg.update(changes)
    cfg["dflash_config"].update(dflash)
    folder = tmp_path / "mismatch"
    write_folder(folder, cfg)
    return load_drafter(folder)


def test_error_hidden_size_mismatch(tmp_path, target):
    d = _load_tiny(tmp_path, hidden_size=2 * pc.TINY_HIDDEN, intermediate_size=2 * pc.TINY_HIDDEN)
    msg = raises(CompatibilityError, Pair.from_models, target, None, d)
    assert "hidden_size 128" in msg and "target hidden size 64" in msg


def test_error_vocab_size_mismatch(tmp_path, target):
    d = _load_tiny(tmp_path, vocab_size=pc.TINY_VOCAB + 32)
    msg = raises(CompatibilityError, Pair.from_models, target, None, d)
    assert f"vocab_size {pc.TINY_VOCAB + 32}" in msg and str(pc.TINY_VOCAB) in msg
    adapter = TargetAdapter(target, d.config.target_layer_ids)
    assert raises(CompatibilityError, check_compatible, adapter, d) == msg


def test_error_target_layer_ids_out_of_range(tmp_path, target):
    d = _load_tiny(tmp_path, dflash={"target_layer_ids": [0, 1, 2, 4, 61]})
    msg = raises(CompatibilityError, Pair.from_models, target, None, d)
    assert "[61]" in msg and str(pc.TINY_TARGET_LAYERS) in msg
    assert f"0..{pc.TINY_TARGET_LAYERS - 1}" in msg
    msg2 = raises(CompatibilityError, TargetAdapter, target, d.config.target_layer_ids)
    assert msg2 == msg


def test_compatible_pair_builds(tmp_path, target, caplog):
    d = _load_tiny(tmp_path)
    with caplog.at_level("WARNING", logger="dflash2_mlx.api"):
        pair = Pair.from_models(target, None, d)
    assert pair.drafter is d and not caplog.records


def test_a_drafter_made_for_a_target_of_other_depth_is_said(tmp_path, target, caplog):
    """Same width and vocabulary, another model (num_target_layers): it runs, exactly, and
    seldom drafts right; said, not silent."""
    d = _load_tiny(tmp_path, num_target_layers=pc.TINY_TARGET_LAYERS + 2)
    with caplog.at_level("WARNING", logger="dflash2_mlx.api"):
        Pair.from_models(target, None, d)
    (said,) = [r.getMessage() for r in caplog.records]
    assert f"made for a target of {pc.TINY_TARGET_LAYERS + 2} layers" in said
    assert f"this one has {pc.TINY_TARGET_LAYERS}" in said


# ----------------------------------------------------------------------------- paths
@pytest.mark.parametrize(
    "path",
    [
        "/definitely/not/here",
        "./not-here",
        "not-a-repo",
        "a/b/c",
        "~/no-such-dflash-drafter-folder",
    ],
)
def test_error_path_neither_folder_nor_repo_id(path):
    t0 = time.monotonic()
    msg = raises(CheckpointError, load_drafter, path, offline=True)
    assert time.monotonic() - t0 < 5
    assert path in msg and "no such folder" in msg


def test_error_path_is_a_file(v2_folder):
    folder, _ = v2_folder
    msg = raises(CheckpointError, load_drafter, folder / "config.json")
    assert str(folder / "config.json") in msg and "file" in msg


@pytest.fixture()
def hang_guard():
    """Fail instead of hanging if something reaches for the network."""

    def alarm(*_):
        raise TimeoutError("load_drafter hung (network access?)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_error_repo_id_offline(monkeypatch, tmp_path, hang_guard):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    t0 = time.monotonic()
    msg = raises(CheckpointError, load_drafter, "z-lab/does-not-exist", offline=True)
    assert time.monotonic() - t0 < 10
    assert "z-lab/does-not-exist" in msg
    assert "offline" in msg.lower() and "cache" in msg.lower()


def test_error_repo_id_with_hub_offline_env(monkeypatch, tmp_path, hang_guard):
    """HF_HUB_OFFLINE set but offline=False: still a quick CheckpointError, no network."""
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    t0 = time.monotonic()
    msg = raises(CheckpointError, load_drafter, "z-lab/does-not-exist")
    assert time.monotonic() - t0 < 10
    assert "z-lab/does-not-exist" in msg and "offline" in msg.lower()


def test_every_error_class_is_a_dflash2_error():
    for cls in (ConfigError, CheckpointError, CompatibilityError):
        assert issubclass(cls, DFlash2Error)


def test_a_failed_save_leaves_the_earlier_drafter_whole(v2_folder, tmp_path, monkeypatch):
    """A write that fails midway (a full disk) is one error naming the folder; the drafter
    saved there before stays as it was and no partial file is left."""
    import dflash2_mlx.checkpoint as ck
    from dflash2_mlx.errors import DFlash2Error

    d = load_drafter(v2_folder[0])
    out = tmp_path / "out"
    save_drafter(d, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = ck.mx.save_safetensors

    def full_disk(path, *args, **kw):
        real(path, *args, **kw)  # a partial file on disk, then the error mlx raises
        raise RuntimeError("[write] Unable to write 1566909 bytes to file.")

    monkeypatch.setattr(ck.mx, "save_safetensors", full_disk)
    with pytest.raises(DFlash2Error, match=r"out: cannot write the drafter there: \[write\]"):
        save_drafter(d, out, extra_files=[("README.md", "card")])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    def interrupted(path, *args, **kw):
        real(path, *args, **kw)
        raise KeyboardInterrupt  # Ctrl-C, or train's SIGTERM

    monkeypatch.setattr(ck.mx, "save_safetensors", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_drafter(d, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / ".model.safetensors.part.safetensors").write_bytes(b"torn")  # what a kill -9 leaves
    monkeypatch.undo()
    assert load_drafter(out).config == d.config  # a staged file is never read as weights
