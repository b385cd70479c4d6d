"""A target model folder checked before mlx-lm loads it: mlx-lm's errors would name neither
the missing file nor a drafter given as the target."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CompatibilityError

_TARGET_JSON = ("config.json", "tokenizer_config.json", "generation_config.json")


def check_target_folder(folder: Path) -> None:
    """A target folder holds a config, parseable JSON files and tokenizer files, and is no
    drafter (mlx-lm's errors would name none of these)."""
    if not (folder / "config.json").is_file():
        raise CompatibilityError(
            f"{folder}: config.json is missing (an mlx-lm model folder holds config.json, "
            "the weights and the tokenizer files)"
        )
    for name in _TARGET_JSON:
        path = folder / name
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CompatibilityError(f"{path}: not a readable JSON file: {exc}") from None
        if not isinstance(config, dict):
            raise CompatibilityError(
                f"{path}: expected a JSON object, found {type(config).__name__}"
            )
        if name == "config.json" and _is_drafter_config(config):
            raise CompatibilityError(
                f"{folder} is a DFlash drafter, not a target model: give it as the drafter, "
                "and as the target the model it drafts for"
            )
    if not any(next(folder.glob(pattern), None) for pattern in _TOKENIZER_FILES):
        raise CompatibilityError(
            f"{folder}: no tokenizer files (tokenizer.json, tokenizer.model, vocab.json, ...)"
        )


def load_target_folder(folder: Path):
    """mlx-lm's (model, tokenizer) from a checked target folder; what mlx-lm raises on a
    broken one (no weights, an unknown model_type, tokenizer files it cannot read) as a
    CompatibilityError naming the folder."""
    from mlx_lm import load

    check_target_folder(folder)
    try:
        return load(str(folder))
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        ImportError,
        RuntimeError,
    ) as exc:
        raise CompatibilityError(
            f"{folder}: cannot load the target with mlx-lm: {type(exc).__name__}: {exc}"
        ) from None


_TOKENIZER_FILES = (
    "tokenizer.json",
    "*.model",
    "vocab.json",
    "vocab.txt",
    "*.tiktoken",
    "tekken.json",
)


def _is_drafter_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    named = isinstance(archs, list) and any("DFlash" in str(a) for a in archs)
    return named or "dflash_config" in config
