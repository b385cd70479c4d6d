"""Logits processors (mlx-lm's: repetition, presence and frequency penalties, logit bias) at
every verified position.

A processor is what `mlx_lm.generate_step` takes: `processor(tokens, logits) -> logits`, with
`tokens` [T] the prompt and every token generated before the position and `logits` [1, V].
Row j of a round follows the committed tokens and the round's drafts[:j], so it is processed
with exactly those: a round accepts what plain decoding with the same processors picks, one
token at a time (greedy), or draws from the processed distribution (sampling). Drafts are
proposed unprocessed (they only need verifying).
"""

from __future__ import annotations

import operator

from typing import Callable, Sequence

import mlx.core as mx

from ..errors import ParameterError
from ..values import is_int, is_number

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def process(
    logits: mx.array,
    processors: Sequence[LogitsProcessor],
    history: Sequence[int],
    drafts: Sequence[int] = (),
) -> mx.array:
    """logits [len(drafts) + 1, V] of a round's positions after `history` (prompt and
    committed tokens), row j processed with history + drafts[:j]."""
    if not processors:
        return logits
    tokens = mx.array([*history, *drafts], dtype=mx.int32)
    rows = []
    for j in range(len(drafts) + 1):
        row = logits[j : j + 1]
        seen = tokens[: len(history) + j]
        for processor in processors:
            row = processor(seen, row)
            if not isinstance(row, mx.array):  # else a TypeError deep in the round
                raise ParameterError(
                    f"logits_processors: {getattr(processor, '__name__', processor)!r} returned "
                    f"{type(row).__name__}, not the logits (an mx.array)"
                )
        rows.append(row)
    return mx.concatenate(rows, axis=0) if len(rows) > 1 else rows[0]


# Settings `penalties` takes and the value at which each does nothing.
PENALTY_FIELDS = {
    "repetition_penalty": 1.0,
    "repetition_context_size": 20,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": {},
}
# The values each may take: OpenAI's ranges (presence, frequency, logit_bias); a repetition
# penalty far outside them only turns logits into inf; a window past 2**31 - 1 overflows
# MLX's slice indices.
RANGES = {
    "repetition_penalty": (0.01, 100.0),
    "repetition_context_size": (1, 2**31 - 1),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "logit_bias": (-100.0, 100.0),
}


def check_penalty(name: str, value, vocab: int):
    """`value` if `name` may take it (logit_bias: {token id: number}), else a ParameterError
    that starts with the name."""
    if name not in PENALTY_FIELDS:
        raise ParameterError(
            f"unknown penalty {name!r}; expected one of {', '.join(PENALTY_FIELDS)}"
        )
    low, high = RANGES[name]

    def bad(problem: str, got) -> ParameterError:
        return ParameterError(f"{name}: {problem}, got {got!r}")

    def number(v, kind=(int, float)):
        if not (is_int(v) if kind is int else is_number(v)) or not low <= v <= high:
            what = "an int" if kind is int else "a number"
            raise bad(f"must be {what} in [{low}, {high}]", v)
        return v if kind is int else float(v)

    if name == "repetition_context_size":
        return number(value, int)
    if name != "logit_bias":
        return number(value)
    if not isinstance(value, dict):
        raise bad("must be a mapping of token ids to numbers", value)
    ids = {}
    for token, v in value.items():
        try:  # NumPy ints too, as prompts take them
            t = operator.index(token) if not isinstance(token, bool) else None
        except TypeError:
            t = None
        if t is None or not 0 <= t < vocab:
            raise bad(f"token ids must be ints in [0, {vocab})", token)
        ids[t] = number(v)
    return ids


def penalties(
    vocab: int, prompt_tokens: int | None = None, **settings
) -> tuple[LogitsProcessor, ...]:
    """Processors for PENALTY_FIELDS settings: mlx-lm's repetition penalty (its window, prompt
    included) and logit bias (mlx_lm.sample_utils.make_logits_processors); presence and
    frequency as OpenAI defines them, over every token after the first `prompt_tokens` (the
    completion so far: required with them), with no window. Each value is checked
    (check_penalty); those that do nothing add no processor."""
    from mlx_lm.sample_utils import make_logits_processors

    if not is_int(vocab, 1):
        raise ParameterError(f"vocab must be the vocabulary size (an int >= 1), got {vocab!r}")
    given = {n: check_penalty(n, v, vocab) for n, v in settings.items() if v is not None}
    active = {n: v for n, v in given.items() if v != PENALTY_FIELDS[n]}
    counted = "presence_penalty" in active or "frequency_penalty" in active
    if counted and prompt_tokens is None:
        raise ParameterError(
            "presence_penalty and frequency_penalty count the completion's tokens: give "
            "prompt_tokens (the prompt's length)"
        )
    if prompt_tokens is not None and not is_int(prompt_tokens, 0):
        raise ParameterError(f"prompt_tokens must be an int >= 0, got {prompt_tokens!r}")
    out = make_logits_processors(
        logit_bias=active.get("logit_bias"),
        repetition_penalty=active.get("repetition_penalty"),
        repetition_context_size=given.get("repetition_context_size", 20),
    )
    presence, frequency = active.get("presence_penalty", 0.0), active.get("frequency_penalty", 0.0)
    if presence or frequency:
        out.append(_occurrence_penalty(presence, frequency, prompt_tokens))
    return tuple(out)


def _occurrence_penalty(presence: float, frequency: float, start: int) -> LogitsProcessor:
    """OpenAI's presence / frequency penalties: logit -= frequency * count + presence * (count
    > 0), counting each token's occurrences in tokens[start:]."""

    def processor(tokens: mx.array, logits: mx.array) -> mx.array:
        generated = tokens[start:]
        if generated.size == 0:
            return logits
        counts = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[generated].add(1.0)
        penalty = frequency * counts + presence * (counts > 0)
        return logits - penalty.astype(logits.dtype)

    return processor
