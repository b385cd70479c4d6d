"""The model object of /v1/models: OpenAI's fields and Anthropic's, and `dflash2`, the engine
every request of this server runs (so a client can see what it gets: peers' users asked to
see the effective engine instead of a silent fallback)."""

from __future__ import annotations

import time

from ..quant import describe_quant, quant_signature
from .chat_prompt import ChatTemplate
from .server_settings import ServerSettings
from .queue import Worker


def model_card(
    pair,
    settings: ServerSettings,
    worker: Worker,
    chat: ChatTemplate,
    *,
    created: int,
    target: str | None,
    drafter: str | None,
    max_queue: int,
    thinking: bool | None,
    prompt_cache_mb: int,
) -> dict:
    """The model object (OpenAI's fields and Anthropic's), with `dflash2`: the engine every
    request of this server runs."""
    return {
        "id": settings.model_name,
        "object": "model",
        "created": created,
        "owned_by": "dflash2",
        "type": "model",
        "display_name": settings.model_name,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        "lifecycle": "active",  # Anthropic's, required in its SDK's model
        "max_input_tokens": settings.context - 1,  # a prompt leaves the reply one token
        "max_tokens": settings.context - 1,
        "dflash2": {
            "speculative": settings.speculative,
            "target": target,
            "weights": describe_quant(quant_signature(pair)),  # a 4-bit copy is told apart
            "drafter": drafter,
            "drafter_version": pair.drafter.config.version,
            "draft_vocab": pair.drafter.draft_vocab_size,
            # what drafting draws on: nothing where the server decodes plainly
            "lookup": pair.decoder.lookup if settings.speculative else 0,
            "datastore": settings.speculative and pair.decoder.datastore is not None,
            "block_size": settings.effective_block,
            "block_by_context": [list(p) for p in settings.drafting.by_context],
            "block_by_temperature": [list(p) for p in settings.drafting.by_temperature],
            "trained_block_size": settings.trained,
            "context_length": settings.context,
            "default_max_tokens": settings.default_max_tokens,
            "max_queue": max_queue,
            "max_batch": worker.capacity,
            "tool_calling": chat.tool_calling,
            "thinking": thinking,
            "thinking_budget": settings.thinking_budget,
            "prompt_cache_mb": prompt_cache_mb,
        },
        "sampling_defaults": settings.sampling.to_json(),
    }
