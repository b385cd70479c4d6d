"""Typed drafter configuration, resolved once from any official DFlash / DFlash2 config.json.

Handles every published variant: `block_size` top-level or in `dflash_config`; `rope_theta`
top-level or in `rope_parameters`; optional `layer_types`, `sliding_window`, `is_causal`,
`output_multiplier`, `final_logit_softcapping`, `input_embedding_scale`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .values import is_int, is_number

ARCH_V1 = "DFlashDraftModel"
ARCH_V2 = "DFlash2DraftModel"
LAYER_TYPES = ("full_attention", "sliding_attention")
V2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass
class DrafterConfig:
    version: int  # 1 = DFlash, 2 = DFlash2
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int | None = None
    rope_scaling: dict[str, Any] | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    is_causal: bool | None = None
    attention_bias: bool = False
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def architecture(self) -> str:
        return ARCH_V2 if self.version == 2 else ARCH_V1

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size if self.conv_group_size else 0

    def layer_is_causal(self, i: int) -> bool:
        """Current reference rule: explicit `is_causal`, else causal iff the layer slides."""
        if self.is_causal is not None:
            return self.is_causal
        return self.layer_types[i] == "sliding_attention"

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None

    @property
    def context_rows_needed(self) -> int | None:
        """Context rows any layer can see; None = all (some layer attends globally)."""
        if all(t == "sliding_attention" for t in self.layer_types):
            return self.sliding_window - 1
        return None

    # ---------------------------------------------------------------- parsing
    @classmethod
    def from_dict(
        cls, cfg: dict[str, Any], source: str = "config.json", mask_token_id: int | None = None
    ) -> "DrafterConfig":
        if not isinstance(cfg, dict):
            raise ConfigError(f"{source}: expected a JSON object, found {type(cfg).__name__}")
        dflash = cfg.get("dflash_config") or {}
        if not isinstance(dflash, dict):
            raise ConfigError(f"{source}: field 'dflash_config' must be an object")
        fields = _Fields(cfg, dflash, source)
        version = _version(fields)
        hidden = fields.get("hidden_size", int)
        heads = fields.get("num_attention_heads", int)
        layers = fields.get("num_hidden_layers", int)
        rope, rope_theta = _rope(fields)
        num_target_layers = cfg.get("num_target_layers")
        ids = _target_layer_ids(fields, num_target_layers, layers)
        mask = _mask_token_id(fields, mask_token_id)
        layer_types, is_causal = _layer_types(fields, layers)
        config = cls(
            version=version,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=fields.get("num_key_value_heads", int, heads),
            head_dim=fields.get("head_dim", int, hidden // heads if heads else 0),
            intermediate_size=fields.get("intermediate_size", int),
            vocab_size=fields.get("vocab_size", int),
            rms_norm_eps=fields.get("rms_norm_eps", float, 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=fields.get("max_position_embeddings", int, 32768),
            block_size=fields.get("block_size", int, 16, nested_first=True),
            target_layer_ids=tuple(ids),
            mask_token_id=mask,
            num_target_layers=num_target_layers,
            rope_scaling=rope,
            layer_types=tuple(layer_types),
            sliding_window=cfg.get("sliding_window"),
            is_causal=is_causal,
            attention_bias=bool(cfg.get("attention_bias", False)),
            final_logit_softcapping=fields.get(
                "final_logit_softcapping", float, None, nested_first=True
            ),
            input_embedding_scale=fields.get(
                "input_embedding_scale", float, 1.0, nested_first=True
            ),
            output_multiplier=fields.get("output_multiplier", float, 1.0, nested_first=True),
            raw=copy.deepcopy(cfg),
        )
        if version == 2:
            for name in V2_FIELDS:
                setattr(config, name, fields.get(name, int, nested_first=True))
        config.validate(source)
        return config

    def validate(self, source: str = "config.json") -> None:
        """Raises ConfigError (naming `source`) for a config no drafter can be built from."""
        try:
            self._check_shapes()
            self._check_rope()
            self._check_ids()
            if self.version == 2:
                self._check_v2()
        except _Invalid as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def _check_shapes(self) -> None:
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "block_size",
        ):
            if getattr(self, name) <= 0:
                raise _Invalid(f"'{name}' must be positive, found {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise _Invalid(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise _Invalid(
                f"'layer_types' has {len(self.layer_types)} entries, expected "
                f"num_hidden_layers = {self.num_hidden_layers}"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise _Invalid(f"unsupported layer_types {unknown}; expected {list(LAYER_TYPES)}")
        if "sliding_attention" in self.layer_types and not (
            isinstance(self.sliding_window, int) and self.sliding_window > 1
        ):
            raise _Invalid(
                f"sliding_attention layers need an int 'sliding_window' > 1, found {self.sliding_window!r}"
            )
        if not self.rms_norm_eps > 0:
            raise _Invalid(f"'rms_norm_eps' must be positive, found {self.rms_norm_eps}")

    def _check_rope(self) -> None:
        """The RoPE settings are ones mlx-lm can build."""
        try:
            from mlx_lm.models.rope_utils import initialize_rope

            initialize_rope(
                self.head_dim,
                self.rope_theta,
                False,
                self.rope_scaling,
                self.max_position_embeddings,
            )
        except Exception as exc:  # noqa: BLE001 - mlx-lm raises ValueError / KeyError
            raise _Invalid(
                f"unsupported RoPE settings {self.rope_scaling!r}: {type(exc).__name__}: {exc}"
            ) from None

    def _check_ids(self) -> None:
        if any(i < 0 for i in self.target_layer_ids):
            raise _Invalid(f"'target_layer_ids' must be >= 0, found {list(self.target_layer_ids)}")
        if self.mask_token_id >= self.vocab_size:
            raise _Invalid(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary ({self.vocab_size})"
            )

    def _check_v2(self) -> None:
        if not 1 <= self.conv_kernel_size <= self.block_size:
            raise _Invalid(
                f"conv_kernel_size must be in 1..block_size ({self.block_size}), found {self.conv_kernel_size}"
            )
        if self.conv_group_size <= 0 or self.hidden_size % self.conv_group_size:
            raise _Invalid(
                f"hidden_size {self.hidden_size} must be divisible by conv_group_size {self.conv_group_size}"
            )
        if not 1 <= self.selector_top_k <= self.vocab_size:
            raise _Invalid(f"selector_top_k must be in 1..vocab_size, found {self.selector_top_k}")
        if self.selector_rank <= 0:
            raise _Invalid(f"selector_rank must be positive, found {self.selector_rank}")

    # ---------------------------------------------------------------- saving
    def to_dict(self) -> dict[str, Any]:
        """Official-format config.json (keeps unknown fields of a loaded config)."""
        out = copy.deepcopy(self.raw)
        for legacy in ("block_size", "mask_token_id", "target_layer_ids", "rope_theta"):
            out.pop(legacy, None)
        dflash = dict(out.get("dflash_config") or {})
        dflash.update(
            block_size=self.block_size,
            mask_token_id=self.mask_token_id,
            target_layer_ids=list(self.target_layer_ids),
        )
        if self.version == 1:  # v1 readers (z-lab PyTorch, transformers 4.x) read the top level
            out["block_size"] = self.block_size
            out["rope_theta"] = self.rope_theta
        if self.version == 2:
            dflash.update({name: getattr(self, name) for name in V2_FIELDS})
        for name, default in (
            ("output_multiplier", 1.0),
            ("input_embedding_scale", 1.0),
            ("final_logit_softcapping", None),
        ):
            if getattr(self, name) != default:
                dflash[name] = getattr(self, name)
        rope = dict(self.rope_scaling or {"rope_type": "default"})
        rope["rope_theta"] = self.rope_theta
        out.pop("rope_scaling", None)
        out.update(
            architectures=[self.architecture],
            model_type=out.get("model_type", "qwen3"),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters=rope,
            layer_types=list(self.layer_types),
            attention_bias=self.attention_bias,
            hidden_act="silu",
            dflash_config=dflash,
        )
        if self.num_target_layers is not None:
            out["num_target_layers"] = self.num_target_layers
        if self.sliding_window is not None:
            out["sliding_window"] = self.sliding_window
            out["use_sliding_window"] = "sliding_attention" in self.layer_types
        if self.is_causal is not None:
            out["is_causal"] = self.is_causal
        return out


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Reference default: spread from layer 1 to T-3; one feature = the middle layer."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


class _Invalid(Exception):
    """A validation failure; DrafterConfig.validate adds the source and raises ConfigError."""


@dataclass
class _Fields:
    """A config.json's top level and its `dflash_config`, read with type checks."""

    cfg: dict[str, Any]
    dflash: dict[str, Any]
    source: str

    def error(self, msg: str) -> ConfigError:
        return ConfigError(f"{self.source}: {msg}")

    def get(self, name: str, kind: type, default: Any = ..., nested_first: bool = False):
        """The field from the top level (or `dflash_config` first), as `kind`; else `default`."""
        places = (self.dflash, self.cfg) if nested_first else (self.cfg, self.dflash)
        for place in places:
            if name in place and place[name] is not None:
                value = place[name]
                break
        else:
            if default is ...:
                raise self.error(f"required field '{name}' is missing")
            return default
        if kind is float and is_int(value):
            value = float(value)
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(f"field '{name}' must be {kind.__name__}, found {value!r}")
        return value


def _version(fields: _Fields) -> int:
    """1 (DFlash) or 2 (DFlash2), from `architectures` or, without one, the fields present."""
    archs = fields.cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise fields.error(f"'architectures' must be a list, found {archs!r}")
    if ARCH_V2 in archs:
        return 2
    if ARCH_V1 in archs:
        return 1
    if not archs:
        return 2 if "conv_kernel_size" in fields.dflash else 1
    raise fields.error(f"unknown architecture {archs}; expected {ARCH_V1} or {ARCH_V2}")


def _rope(fields: _Fields) -> tuple[dict[str, Any] | None, int | float]:
    """(rope scaling object, rope_theta): top-level or inside `rope_parameters`."""
    cfg = fields.cfg
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if rope is not None and not isinstance(rope, dict):
        raise fields.error(f"'rope_parameters' / 'rope_scaling' must be an object, found {rope!r}")
    rope_theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
    if not is_number(rope_theta) or rope_theta <= 0:
        raise fields.error(f"'rope_theta' must be a positive number, found {rope_theta!r}")
    return rope, rope_theta


def _target_layer_ids(fields: _Fields, num_target_layers: Any, layers: int) -> list[int]:
    """The target layers the drafter reads: given, else the reference default."""
    cfg, dflash = fields.cfg, fields.dflash
    if "target_layer_ids" in dflash or "target_layer_ids" in cfg:
        ids = dflash.get("target_layer_ids", cfg.get("target_layer_ids"))
        if not isinstance(ids, list) or not ids or not all(is_int(i) for i in ids):
            raise fields.error(
                f"'target_layer_ids' must be a non-empty list of ints, found {ids!r}"
            )
        return ids
    if isinstance(num_target_layers, int):
        return default_target_layer_ids(num_target_layers, layers)
    raise fields.error(
        "'dflash_config.target_layer_ids' is missing (and no 'num_target_layers' to derive it from)"
    )


def _mask_token_id(fields: _Fields, given: int | None) -> int:
    """`given` if set, else the config's; older drafters have none (then it must be given)."""
    mask = (
        given
        if given is not None
        else fields.dflash.get("mask_token_id", fields.cfg.get("mask_token_id"))
    )
    if mask is None:
        raise fields.error(
            "'dflash_config.mask_token_id' is missing (an older drafter): add it to the "
            'config.json, as "dflash_config": {"mask_token_id": N}, N the id of the token '
            "the drafter was trained with (its mask token in the target's tokenizer, often "
            "'<|MASK|>' or '<mask>'), or give "
            "mask_token_id= to load_drafter"
        )
    if not is_int(mask, 0):
        raise fields.error(f"'mask_token_id' must be a non-negative int, found {mask!r}")
    return mask


def _layer_types(fields: _Fields, layers: int) -> tuple[list[str], bool | None]:
    """(each layer's attention type, default all full; the explicit `is_causal` or None)."""
    layer_types = fields.cfg.get("layer_types") or ["full_attention"] * layers
    if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
        raise fields.error(f"'layer_types' must be a list of strings, found {layer_types!r}")
    is_causal = fields.cfg.get("is_causal")
    if is_causal is not None and not isinstance(is_causal, bool):
        raise fields.error(f"'is_causal' must be true or false, found {is_causal!r}")
    return layer_types, is_causal
