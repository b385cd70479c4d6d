"""Load and save drafters in the official Hugging Face format, with strict validation.

Format: config.json + *.safetensors with the tensor names of z-lab's checkpoints (no prefix,
no embedding / LM head; DFlash2 codebooks are raw tensors without a ".weight" suffix).
"""

from __future__ import annotations

import json
import os
import math
from pathlib import Path
from typing import Iterable

import mlx.core as mx
from mlx.utils import tree_flatten

from .config import DrafterConfig
from .drafter.model import Drafter
from .drafter.vocab import DRAFT_VOCAB_FILE, read_draft_vocab
from .errors import CheckpointError, ConfigError, DFlash2Error, ParameterError
from .downloads import fetch
from .values import is_int

WEIGHTS_NAME = "model.safetensors"


def expected_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of an official checkpoint with its shape (no allocation)."""
    h, d, i_sz = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes = {
        "fc.weight": (h, len(cfg.target_layer_ids) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (i_sz, h),
                p + "mlp.up_proj.weight": (i_sz, h),
                p + "mlp.down_proj.weight": (h, i_sz),
            }
        )
        if cfg.attention_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                    p + "self_attn.o_proj.bias": (h,),
                }
            )
        if cfg.version == 2:
            t, g = cfg.conv_kernel_size, cfg.conv_groups
            for conv in ("attention_conv", "mlp_conv"):
                shapes[p + f"{conv}.base_kernel"] = (2, t, h)
                shapes[p + f"{conv}.kernel_projection.weight"] = (2 * t * g, h)
    if cfg.version == 2:
        r, v = cfg.selector_rank, cfg.vocab_size
        shapes.update(
            {
                "candidate_selector.hidden_projection.weight": (r, h),
                "candidate_selector.predecessor_codebook": (v, r),
                "candidate_selector.successor_codebook": (v, r),
            }
        )
    return shapes


def parameter_count(cfg: DrafterConfig) -> int:
    return sum(math.prod(s) for s in expected_shapes(cfg).values())


def _canonical_name(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model.") :]
    for book in ("predecessor_codebook", "successor_codebook"):
        if name == f"candidate_selector.{book}.weight":
            return f"candidate_selector.{book}"
    return name


FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def check_weights(
    cfg: DrafterConfig, weights: dict[str, mx.array], source: str
) -> dict[str, mx.array]:
    """Rename tolerated variants, then demand exactly the expected tensors and shapes."""
    renamed: dict[str, mx.array] = {}
    for name, value in weights.items():
        canon = _canonical_name(name)
        if canon in renamed:
            raise CheckpointError(f"{source}: tensor '{name}' appears twice (as '{canon}')")
        renamed[canon] = value
    expected = expected_shapes(cfg)
    missing = sorted(set(expected) - set(renamed))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(
            f"{source}: missing tensor {', '.join(repr(m) for m in missing[:5])}{more} "
            f"for a {cfg.architecture} with {cfg.num_hidden_layers} layers"
        )
    unexpected = sorted(set(renamed) - set(expected))
    quantized = [u for u in unexpected if u.endswith((".scales", ".biases"))]
    if quantized:
        raise CheckpointError(
            f"{source}: a quantized drafter (tensor '{quantized[0]}'): not supported; use its "
            "unquantized weights (float32, float16 or bfloat16)"
        )
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise CheckpointError(
            f"{source}: unexpected tensor {', '.join(repr(u) for u in unexpected[:5])}{more} "
            f"for a {cfg.architecture}"
        )
    for name, shape in expected.items():
        found = tuple(renamed[name].shape)
        if found != shape:
            raise CheckpointError(
                f"{source}: tensor '{name}' has shape {list(found)}, expected {list(shape)}"
            )
        if renamed[name].dtype not in FLOAT_DTYPES:  # FP8 reads as uint8: casts would be noise
            raise CheckpointError(
                f"{source}: tensor '{name}' is {str(renamed[name].dtype).removeprefix('mlx.core.')}"
                "; a drafter's weights are float32, float16 or bfloat16 (FP8 and quantized "
                "drafters are not supported)"
            )
    return renamed


def read_config(folder: Path, mask_token_id: int | None = None) -> DrafterConfig:
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{folder}: config.json is missing")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{cfg_path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a folder, unreadable, not text
        raise ConfigError(f"{cfg_path}: cannot read it: {exc}") from None
    if _is_a_model_config(raw):
        raise CheckpointError(
            f"{folder} is a {raw['model_type']} model, not a DFlash drafter (its config.json "
            "has no dflash_config): give it as the target, and as the drafter one trained for it"
        )
    return DrafterConfig.from_dict(raw, str(cfg_path), mask_token_id=mask_token_id)


def _is_a_model_config(raw) -> bool:
    """A model's config.json (the target given as the drafter): no field a drafter has."""
    drafter_fields = ("dflash_config", "target_layer_ids", "num_target_layers", "block_size")
    archs = raw.get("architectures") if isinstance(raw, dict) else None
    named = isinstance(archs, list) and any("DFlash" in str(a) for a in archs)
    return (
        isinstance(raw, dict)
        and isinstance(raw.get("model_type"), str)
        and not named
        and not any(f in raw for f in drafter_fields)
    )


def read_weights(folder: Path) -> dict[str, mx.array]:
    # a dotfile is a save_drafter's staged file that a kill left, not the drafter's
    files = sorted(f for f in folder.glob("*.safetensors") if not f.name.startswith("."))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors file")
    weights: dict[str, mx.array] = {}
    source: dict[str, Path] = {}  # a tensor's file: one in two files is a stray export
    for f in files:
        try:
            part = mx.load(str(f))
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"{f}: cannot read safetensors: {exc}") from None
        twice = sorted(k for k in part if k in source)
        if twice:
            raise CheckpointError(
                f"{folder}: tensor {twice[0]!r} is in both {source[twice[0]].name} and {f.name}"
                f"{f' (and {len(twice) - 1} more)' if len(twice) > 1 else ''}: a checkpoint "
                "holds each once; move the stray file out of the folder"
            )
        weights.update(part)
        source.update((k, f) for k in part)
    return weights


def load_drafter(
    path_or_repo: str | Path,
    *,
    dtype: mx.Dtype | None = None,
    mask_token_id: int | None = None,
    revision: str | None = None,
    offline: bool = False,
    draft_vocab: bool = True,
    draft_vocab_limit: int | None = None,
) -> Drafter:
    """Load an official DFlash / DFlash2 drafter; the result still needs `bind()` to a target.
    `draft_vocab`: use the folder's draft_vocab.json when it has one (False: draft from the
    whole vocabulary); `draft_vocab_limit`: only its N most frequent ids (a smaller draft head;
    the rare ids it drops are almost never drafted right anyway)."""
    folder = fetch(path_or_repo, "drafter", revision=revision, offline=offline)
    cfg = read_config(folder, mask_token_id)
    ids = read_draft_vocab(folder, cfg.vocab_size) if draft_vocab else None
    if draft_vocab_limit is not None:  # checked before the weights are read
        ids = _limit_draft_vocab(ids, draft_vocab_limit, draft_vocab, cfg, folder)
    weights = check_weights(cfg, read_weights(folder), str(folder))
    if dtype is not None:
        weights = {k: v.astype(dtype) for k, v in weights.items()}
    model = Drafter(cfg)
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model.set_draft_vocab(ids)


def check_draft_vocab_limit(limit) -> None:
    if limit is not None and not is_int(limit):
        raise ParameterError(f"draft_vocab_limit must be an int or None, got {limit!r}")


def _limit_draft_vocab(
    ids: list[int] | None, limit: int, use_file: bool, cfg: DrafterConfig, folder: Path
) -> list[int]:
    """The `limit` most frequent ids (draft_vocab.json lists them most frequent first)."""
    check_draft_vocab_limit(limit)
    if not use_file:
        raise ParameterError(
            "a draft-vocabulary limit contradicts drafting from the whole vocabulary"
        )
    if ids is None:
        raise CheckpointError(
            f"{folder}: has no {DRAFT_VOCAB_FILE}, so there is no draft "
            "vocabulary to limit (dflash2 train writes one)"
        )
    least = cfg.selector_top_k if cfg.version == 2 else 1  # the selector ranks top-K ids
    if limit < least:
        raise ParameterError(
            f"the draft-vocabulary limit is {limit}; it must be at least {least}"
            + (" (the selector's top-K)" if least > 1 else "")
            + " (draft_vocab_limit, --draft-vocab)"
        )
    return ids[:limit]


def save_drafter(
    model: Drafter,
    folder: str | Path,
    dtype: mx.Dtype | None = None,
    extra_files: Iterable[tuple[str, str | bytes]] = (),
) -> Path:
    """Write config.json + model.safetensors in the official format, and `extra_files`
    (name, text or bytes). Each file is written beside its place and renamed over it: a failed
    write (a full disk) leaves the folder's earlier drafter whole."""
    if not isinstance(model, Drafter):
        raise ParameterError(f"model must be a Drafter, got {type(model).__name__}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(tree_flatten(model.parameters()))
    check_weights(model.config, params, f"{type(model).__name__} parameters")
    if dtype is not None:
        params = {k: v.astype(dtype) for k, v in params.items()}
    cfg = model.config.to_dict()
    cfg["dtype"] = str(next(iter(params.values())).dtype).replace("mlx.core.", "")
    texts = [("config.json", json.dumps(cfg, indent=2) + "\n"), *extra_files]
    staged = {WEIGHTS_NAME: folder / f".{WEIGHTS_NAME}.part.safetensors"}  # mlx adds the suffix
    staged.update((name, folder / f".{name}.part") for name, _ in texts)
    written = False
    try:
        mx.save_safetensors(str(staged[WEIGHTS_NAME]), params, metadata={"format": "mlx"})
        for name, content in texts:
            if isinstance(content, bytes):
                staged[name].write_bytes(content)
            else:
                staged[name].write_text(content)
        written = True
    except (OSError, RuntimeError) as e:  # mlx's failed write is a RuntimeError
        raise DFlash2Error(f"{folder}: cannot write the drafter there: {e}") from None
    finally:  # a failure or an interrupt leaves no staged file (read_weights skips them)
        for part in staged.values() if not written else ():
            part.unlink(missing_ok=True)
    for name, part in staged.items():
        os.replace(part, folder / name)
    return folder
