"""A request's generation parameters (`plan`): its max_tokens against the context (OpenAI's
and Anthropic's rules), the server's sampling and drafting defaults, its penalties."""

from __future__ import annotations

from ..engine.generation import GenerationParams
from ..engine.processors import check_penalty, penalties
from ..errors import ParameterError
from .limits import context_exceeded, prompt_too_long
from .schemas import GenRequest, invalid
from .server_settings import ServerSettings

# OpenAI's default for a completions request with no max_tokens (chat's: the whole room).
COMPLETION_MAX_TOKENS = 16


def _unset_default(req: GenRequest, room: int) -> int:
    """max_tokens for a request that gives none when the server sets no default."""
    return COMPLETION_MAX_TOKENS if req.kind == "completion" else room


def plan(
    s: ServerSettings,
    req: GenRequest,
    ids: list[int],
    predicted: tuple[int, ...],
    constraint=None,  # GenerationParams.constraint
) -> GenerationParams:
    where = "messages" if req.kind == "chat" else "prompt"
    if not ids:
        raise invalid(where, "the prompt is empty after tokenization")
    room = s.context - len(ids)
    if room < 1:
        if req.anthropic:
            raise prompt_too_long(s.context, len(ids))
        raise context_exceeded(s.context, where, len(ids))
    max_tokens = req.max_tokens
    if max_tokens is None:
        max_tokens = min(s.default_max_tokens or _unset_default(req, room), room)
    elif past_window(s, req, len(ids)):
        max_tokens = room  # Anthropic's newer models: up to the context's end
    elif max_tokens > room:
        raise context_exceeded(s.context, where, len(ids), max_tokens, param=req.max_tokens_param)
    if predicted and not s.speculative:
        raise invalid(
            "prediction",
            "Predicted Outputs are a drafting hint and this server decodes without drafts "
            "(--no-spec): leave prediction out",
        )
    sampling = s.sampling.complete(req.sampling_fields)
    return GenerationParams(
        max_tokens=max(max_tokens, 1),  # 0: a prompt only echoed (Job.generate)
        sampling=sampling,
        **s.drafting_fields(sampling),
        prediction=predicted,
        constraint=constraint,
        logits_processors=_processors(s, req, len(ids)),
        logprobs=req.logprobs,
    )


def past_window(s: ServerSettings, req: GenRequest, prompt_tokens: int) -> bool:
    """A Messages request whose max_tokens goes past the context: it generates up to the
    context's end (stop_reason model_context_window_exceeded), not a 400."""
    asked = req.max_tokens
    return req.anthropic and asked is not None and prompt_tokens + asked > s.context


def _processors(s: ServerSettings, req: GenRequest, prompt_tokens: int) -> tuple:
    """The request's penalties and logit_bias as logits processors (presence and frequency
    count the completion's tokens, after the prompt's `prompt_tokens`)."""
    for name, value in req.penalties.items():
        try:
            check_penalty(name, value, s.vocab)
        except ParameterError as e:
            raise invalid(name, str(e)) from None
    return penalties(s.vocab, prompt_tokens, **req.penalties)
