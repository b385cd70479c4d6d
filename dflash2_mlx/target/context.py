"""The context length a target was trained for, read off its config."""

from __future__ import annotations


def default_context_length(model) -> int:
    """The target's max_position_embeddings (text_config included), else 4096."""
    return trained_context_length(model) or 4096


def trained_context_length(model) -> int | None:
    """The target's max_position_embeddings (text_config included), None if it gives none."""
    args = getattr(model, "args", None)
    for src in (args, getattr(args, "text_config", None)):
        v = (
            src.get("max_position_embeddings")
            if isinstance(src, dict)
            else getattr(src, "max_position_embeddings", None)
        )
        if isinstance(v, int) and v > 0:
            return v
    return None
