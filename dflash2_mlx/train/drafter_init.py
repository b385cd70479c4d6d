"""A new drafter for a target: its config shaped like the target's layers, and its starting
weights (random with sharpened q/k norms, the target's top layers, or another drafter's)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ..checkpoint import load_drafter, read_config
from ..config import DrafterConfig, default_target_layer_ids
from ..drafter.model import Drafter
from ..errors import DFlash2Error
from ..target.adapter import TargetAdapter
from .config import TrainConfig


def _distills(cfg: TrainConfig) -> bool:
    """A KL to the target's distribution is trained (read off the last layer's features)."""
    return cfg.distill_weight > 0 or (cfg.fixed_ratio > 0 and cfg.fixed_distill_weight > 0)


def _default_layer_ids(n_layers: int, last: bool) -> list[int]:
    """The reference spread of five target layers, distinct (on a shallow target it repeats
    layers: 4 layers give [1, 1, 1, 1, 1]); ending at the last layer when `last` (a
    distillation reads the target's logits off its output)."""
    ids = default_target_layer_ids(n_layers, 5)
    if last:
        ids[-1] = n_layers - 1
    return sorted(set(ids))


def drafter_config_for(
    adapter: TargetAdapter, target_config: dict, cfg: TrainConfig
) -> DrafterConfig:
    """A drafter config shaped like the target's own layers (Qwen3-style, official fields)."""
    n_layers = len(adapter.layers)
    ids = list(cfg.target_layer_ids or _default_layer_ids(n_layers, _distills(cfg)))
    bad = [i for i in ids if not 0 <= i < n_layers]
    if bad:
        raise DFlash2Error(
            f"target layer ids (--layer-ids) {bad} out of range: the target has {n_layers} layers "
            f"(valid 0..{n_layers - 1})"
        )
    if len(set(ids)) < len(ids):
        raise DFlash2Error(f"target layer ids (--layer-ids) {ids} name a layer twice")
    if cfg.init_from_target and cfg.layers > n_layers:  # the copy would wrap round to layer 0
        raise DFlash2Error(
            f"--init-from-target copies the target's top --layers layers: --layers {cfg.layers} "
            f"is more than the target's {n_layers}"
        )
    if cfg.mask_token_id is None:
        raise DFlash2Error("a mask token id is needed (an id the target never emits)")
    if not 0 <= cfg.mask_token_id < adapter.vocab_size:
        raise DFlash2Error(
            f"mask token id {cfg.mask_token_id} (--mask-token-id) is outside the target's "
            f"vocabulary [0, {adapter.vocab_size})"
        )
    tc = target_config.get("text_config", target_config)
    heads = int(tc.get("num_attention_heads", 8))
    raw = {
        "architectures": ["DFlash2DraftModel" if cfg.version == 2 else "DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": adapter.hidden_size,
        "intermediate_size": int(tc.get("intermediate_size", 4 * adapter.hidden_size)),
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(tc.get("num_key_value_heads", heads)),
        "head_dim": int(tc.get("head_dim") or adapter.hidden_size // heads),
        "rms_norm_eps": float(tc.get("rms_norm_eps", 1e-6)),
        "vocab_size": adapter.vocab_size,
        "max_position_embeddings": int(tc.get("max_position_embeddings", 8192)),
        "rope_theta": float(tc.get("rope_theta", 10000.0)),
        "num_target_layers": n_layers,
        "tie_word_embeddings": False,
        "is_causal": False,
        "dflash_config": {
            "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": ids,
        },
    }
    if cfg.version == 2:
        raw["dflash_config"].update(
            conv_kernel_size=cfg.conv_kernel_size,
            conv_group_size=cfg.conv_group_size,
            selector_rank=cfg.selector_rank,
            selector_top_k=cfg.selector_top_k,
        )
    if cfg.start_layout:  # --init-from: its own geometry and attention, not the target's
        _keep_start_layout(raw, dict(cfg.start_layout), cfg.layers)
    return DrafterConfig.from_dict(raw, "generated drafter config")


# What an --init-from drafter keeps of its own config: the target's would be another model.
_START_FIELDS = (
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_parameters",
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "is_causal",
    "attention_bias",
)
_START_DFLASH_FIELDS = ("output_multiplier", "input_embedding_scale", "final_logit_softcapping")


def _start_layout(start: DrafterConfig) -> dict:
    official = start.to_dict()
    dflash = official["dflash_config"]
    layout = {k: official[k] for k in _START_FIELDS if k in official}
    return layout | {k: dflash[k] for k in _START_DFLASH_FIELDS if k in dflash}


def _keep_start_layout(raw: dict, layout: dict, layers: int) -> None:
    types = layout.get("layer_types")
    if types:  # a grown layer is a copy of the last one (grown_layers): its type too
        layout["layer_types"] = (list(types) + [types[-1]] * layers)[:layers]
    raw.pop("rope_theta")  # in rope_parameters
    raw.pop("is_causal")  # unset there: its sliding layers are causal, the others not
    for k, v in layout.items():
        (raw["dflash_config"] if k in _START_DFLASH_FIELDS else raw)[k] = v


def adopt_start(cfg: TrainConfig, folder: Path) -> None:
    """--init-from: the run reads the target layers and uses the mask token its start drafter
    was trained with (its fc weighs each layer's features); other ones given are refused.
    Its geometry and attention (heads, sliding windows, RoPE, norms) are kept too."""
    start = read_config(Path(folder))
    for flag, field, theirs in (
        ("--layer-ids", "target_layer_ids", tuple(start.target_layer_ids)),
        ("--mask-token-id", "mask_token_id", start.mask_token_id),
    ):
        given = getattr(cfg, field)
        if given is None:
            setattr(cfg, field, theirs)
        elif (tuple(given) if isinstance(given, (list, tuple)) else given) != theirs:
            shown = ",".join(map(str, theirs)) if isinstance(theirs, tuple) else theirs
            raise DFlash2Error(
                f"{flag}: the --init-from drafter {folder} was trained with {shown}; leave "
                f"{flag} out to use that (other values would feed it what it never learned)"
            )
    if start.version == cfg.version == 2:  # its conv and selector shapes (no flags set them)
        for field in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            setattr(cfg, field, getattr(start, field))
    cfg.start_layout = _start_layout(start)


def check_start_fits(folder: Path, adapter: TargetAdapter) -> None:
    """--init-from: a drafter trained for another target (other width, deeper layers tapped)
    is refused by what differs, before its layer ids or tensors are blamed."""
    start, n_layers = read_config(Path(folder)), len(adapter.layers)
    if start.hidden_size != adapter.hidden_size or max(start.target_layer_ids) >= n_layers:
        raise DFlash2Error(
            f"--init-from {folder}: was trained for another target (hidden size "
            f"{start.hidden_size}, target layers {list(start.target_layer_ids)}); this target "
            f"has {n_layers} layers of hidden size {adapter.hidden_size}: start from a drafter "
            "of this target, or leave --init-from out"
        )


def init_drafter(dcfg: DrafterConfig, cfg: TrainConfig) -> Drafter:
    mx.random.seed(cfg.seed)
    d = Drafter(dcfg)
    if cfg.qk_norm_init != 1.0:  # sharper initial attention than uniform
        for layer in d.layers:
            layer.self_attn.q_norm.weight = mx.full(dcfg.head_dim, cfg.qk_norm_init)
            layer.self_attn.k_norm.weight = mx.full(dcfg.head_dim, cfg.qk_norm_init)
    mx.eval(d.parameters())
    return d


def init_from_target(drafter: Drafter, adapter: TargetAdapter, scale: mx.array) -> None:
    """Start from the target's own top layers: drafter layer j <- target layer N-L+j (same
    shapes by construction), and fc passes the last captured feature through so the context
    rows start as the target's top hidden states (normed by the first copied layer's norm)."""
    cfg, n_target = drafter.config, len(adapter.layers)
    params = {}
    for j in range(cfg.num_hidden_layers):
        src = dict(tree_flatten(adapter.layers[n_target - cfg.num_hidden_layers + j].parameters()))
        mine = dict(tree_flatten(drafter.layers[j].parameters()))
        for name, value in src.items():
            if name in mine and mine[name].shape == value.shape:
                params[f"layers.{j}.{name}"] = value.astype(mx.float32)
    h = cfg.hidden_size
    fc = mx.zeros((h, len(cfg.target_layer_ids) * h))
    fc[:, -h:] = mx.diag(1.0 / scale[-h:])
    params["fc.weight"] = fc
    first = adapter.layers[n_target - cfg.num_hidden_layers]
    params["hidden_norm.weight"] = first.input_layernorm.weight.astype(mx.float32)
    drafter.load_weights(list(params.items()), strict=False)
    mx.eval(drafter.parameters())


def init_from_drafter(drafter: Drafter, folder: str | Path, scale: mx.array) -> None:
    """Start from a drafter with the same shapes (its block size may differ: block positions
    are RoPE'd, not learned): an exported folder (feature scaling folded into fc) or a training
    checkpoint folder (fc unfolded, its scaling beside it in feature_scale.npy). A source with
    fewer layers grows: see `grown_layers`."""
    src = start_tensors(drafter, folder)
    src["fc.weight"] = src["fc.weight"] / scale[None, :]
    mine = dict(tree_flatten(drafter.parameters()))
    drafter.load_weights([(k, src[k].astype(mx.float32)) for k in mine], strict=True)
    mx.eval(drafter.parameters())


def start_tensors(drafter: Drafter, folder: str | Path) -> dict[str, mx.array]:
    """`folder`'s tensors (fc with its feature scaling folded in, new layers grown) checked
    against `drafter`'s names and shapes: a DFlash2Error names the first that does not fit."""
    start = load_drafter(folder)
    if start.config.version != drafter.config.version:
        kind = {1: "DFlash", 2: "DFlash2"}
        raise DFlash2Error(
            f"{folder}: is a {kind[start.config.version]} drafter; --version "
            f"{drafter.config.version} trains a {kind[drafter.config.version]} one: give "
            f"--version {start.config.version} to start from it"
        )
    src = dict(tree_flatten(start.parameters()))
    ckpt_scale = Path(folder) / "feature_scale.npy"
    if ckpt_scale.exists():
        src["fc.weight"] = src["fc.weight"] * mx.array(np.load(ckpt_scale))[None, :]
    n_src, n_mine = _layer_count(src), drafter.config.num_hidden_layers
    if n_src > n_mine:
        raise DFlash2Error(
            f"{folder}: has {n_src} layers, more than this drafter's {n_mine} (--layers); "
            "--init-from can grow a drafter, not cut one"
        )
    src.update(grown_layers(src, n_mine))
    for name, value in tree_flatten(drafter.parameters()):
        if name not in src:
            raise DFlash2Error(
                f"{folder}: has no tensor {name!r}; --init-from needs a drafter "
                f"of the same kind (DFlash {drafter.config.version}, "
                f"at most {drafter.config.num_hidden_layers} layers)"
            )
        if src[name].shape != value.shape:
            raise DFlash2Error(
                f"{folder}: tensor {name!r} has shape {tuple(src[name].shape)}, "
                f"expected {tuple(value.shape)}"
            )
    return src


# The projections that write a layer's sublayers into the residual stream.
_RESIDUAL_WRITERS = ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight")


def grown_layers(src: dict[str, mx.array], n_layers: int) -> dict[str, mx.array]:
    """Layers n_src..n_layers-1 for a source drafter with n_src layers: copies of its last
    layer whose residual writers are zero, so each new layer starts as the identity and the
    grown drafter computes exactly the source's function until training moves them."""
    n_src = _layer_count(src)
    last = {k.split(".", 2)[2]: v for k, v in src.items() if k.startswith(f"layers.{n_src - 1}.")}
    out = {}
    for j in range(n_src, n_layers):
        for name, value in last.items():
            out[f"layers.{j}.{name}"] = mx.zeros_like(value) if name in _RESIDUAL_WRITERS else value
    return out


def _layer_count(params: dict[str, mx.array]) -> int:
    return 1 + max((int(k.split(".")[1]) for k in params if k.startswith("layers.")), default=-1)
