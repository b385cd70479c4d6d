"""A target model folder checked before mlx-lm loads it: mlx-lm's errors would name neither
the missing file nor a drafter given as the target."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CompatibilityError
from ..values import is_int

_TARGET_JSON = ("config.json", "tokenizer_config.json", "generation_config.json")
# Fields every decoder's config has, by the type it needs: mlx-lm's errors name none of them.
_COUNTS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
_FLAGS = ("tie_word_embeddings",)
_TOKEN_IDS = ("eos_token_id",)  # the one the engine uses (a pad id is often -1)


def check_target_folder(folder: Path) -> None:
    """A target folder holds a config, parseable JSON files and tokenizer files, and is no
    drafter (mlx-lm's errors would name none of these)."""
    if not (folder / "config.json").is_file():
        snapshot = _cached_snapshot(folder)
        hint = (  # a Hugging Face cache's repo folder (models--org--name)
            f": the model is in {snapshot}, or give its repo id"
            if snapshot
            else " (an mlx-lm model folder holds config.json, the weights and the tokenizer files)"
        )
        raise CompatibilityError(f"{folder}: config.json is missing{hint}")
    _check_shards(folder)
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
        _check_field_types(path, config)
    if not any(next(folder.glob(pattern), None) for pattern in _TOKENIZER_FILES):
        raise CompatibilityError(
            f"{folder}: no tokenizer files (tokenizer.json, tokenizer.model, vocab.json, ...)"
        )


def _cached_snapshot(repo: Path) -> Path | None:
    """A Hugging Face cache repo folder's current snapshot (refs/main), else its newest."""
    try:
        current = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
        if (current / "config.json").is_file():
            return current
    except OSError:
        pass
    found = [p.parent for p in (repo / "snapshots").glob("*/config.json")]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def _check_shards(folder: Path) -> None:
    """Every weights file the index lists is there (an interrupted download leaves one out;
    mlx-lm would report its tensors missing, not the file)."""
    index = folder / "model.safetensors.index.json"
    try:
        listed = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # none, or unreadable: mlx-lm reads the weights files themselves
    missing = sorted(name for name in listed if not (folder / str(name)).is_file())
    if missing:
        raise CompatibilityError(
            f"{folder}: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
            f"missing ({len(missing)} of the {len(listed)} weights files {index.name} lists; "
            "an interrupted download?)"
        )


def _check_field_types(path: Path, config: dict) -> None:
    """The common fields of `config` (top level, or a multimodal model's text_config) have the
    types mlx-lm needs; an absent or null field is the model's own business."""
    for where, fields in (("", config), ("text_config.", config.get("text_config"))):
        for name, value in fields.items() if isinstance(fields, dict) else ():
            if value is None:
                continue
            if name in _COUNTS and not (
                _is_count(value)
                or (isinstance(value, list) and value and all(map(_is_count, value)))
            ):  # a list: per-layer sizes (Gemma 3n)
                want = "a whole number >= 1"
            elif name in _FLAGS and not isinstance(value, bool):
                want = "true or false"
            elif name in _TOKEN_IDS and not (
                _is_id(value) or (isinstance(value, list) and all(map(_is_id, value)))
            ):
                want = "a token id (an integer >= 0) or a list of them"
            else:
                continue
            raise CompatibilityError(f"{path}: {where}{name} must be {want}, got {value!r}")


def _is_count(value) -> bool:
    return is_int(value, 1)


def _is_id(value) -> bool:
    return is_int(value, 0)


def load_target_folder(folder: Path, chat_template: str | None = None):
    """mlx-lm's (model, tokenizer) from a checked target folder (`chat_template`: in place of
    the folder's, as mlx_lm.server's --chat-template); what mlx-lm raises on a broken one (no
    weights, an unknown model_type, tokenizer files it cannot read) as a CompatibilityError
    naming the folder."""
    from mlx_lm import load

    check_target_folder(folder)
    try:
        # (a chat_template of None in tokenizer_config would remove the folder's own)
        config = {"chat_template": chat_template} if chat_template else None
        model, tokenizer = load(str(folder), tokenizer_config=config)
    except (
        _StrictDataclassError,  # transformers' config classes check some field types
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
    if not chat_template:  # one given in its place was checked where it was read
        _check_own_template(Path(folder), tokenizer)
    return model, tokenizer


def _check_own_template(folder: Path, tokenizer) -> None:
    """A CompatibilityError naming the file when the folder's chat template does not compile:
    else every chat request would be refused, as if its messages were at fault."""
    from ..chat_template import template_syntax_error

    failed = template_syntax_error(tokenizer)
    if failed is None:
        return
    name, exc = failed
    if name is None:  # the one template: from the file transformers read it from
        where = next(
            (folder / n for n in TEMPLATE_FILES if (folder / n).is_file()),
            folder / "tokenizer_config.json",
        )
        what = "its chat template"
    else:
        where, what = folder, f"its chat template {name!r}"
    line = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
    raise CompatibilityError(
        f"{where}: {what} does not parse{line}: {exc}; mend it, or give one in its place "
        "(chat_template=, --chat-template)"
    )


# where transformers reads a chat template before tokenizer_config.json's
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


try:
    from huggingface_hub.errors import StrictDataclassError as _StrictDataclassError
except ImportError:  # an older huggingface_hub checks no field types

    class _StrictDataclassError(Exception):
        pass


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
