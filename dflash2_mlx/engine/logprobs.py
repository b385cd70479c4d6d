"""Log-probabilities of committed tokens, read off the verify forward's rows.

Row j of a round's logits is the target's distribution at the j-th committed position (after
the generation's logits processors and constraint, before temperature and top-p/k/min-p, as
`mlx_lm.generate_step` reports them), so every committed token's log-probability comes from
the forward that verified it: no extra forward, the same numbers plain decoding gives (up to
the float rounding of a wider matmul).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
from ..values import is_int

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs
# What OpenAI writes for a token that cannot come (here: one a constraint forbids, -inf).
IMPOSSIBLE = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability under the target (after the generation's
    processors and constraint) and the `top` alternatives there."""

    token: int
    logprob: float | None  # None: a prompt's first token, which nothing before it scores
    top: tuple[tuple[int, float], ...] = ()  # the most likely tokens there, most likely first


def token_logprobs(logits: mx.array, tokens: Sequence[int], top: int) -> tuple[TokenLogprob, ...]:
    """Each of `tokens`' log-probability under its row of `logits` [len(tokens), V] (more rows
    are ignored), with the `top` most likely tokens of that row; IMPOSSIBLE at the least."""
    n = len(tokens)
    if n == 0:
        return ()
    rows = logits[:n].astype(mx.float32)
    lp = mx.maximum(rows - mx.logsumexp(rows, axis=-1, keepdims=True), IMPOSSIBLE)
    chosen = mx.take_along_axis(lp, mx.array(list(tokens))[:, None], axis=-1)[:, 0]
    if top > 0:
        k = min(top, lp.shape[-1])
        ids = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
        vals = mx.take_along_axis(lp, ids, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        ids, vals = (
            mx.take_along_axis(ids, order, axis=-1),
            mx.take_along_axis(vals, order, axis=-1),
        )
        best = list(zip(ids.tolist(), vals.tolist()))
    else:
        best = [((), ())] * n
    return tuple(
        TokenLogprob(int(t), float(c), tuple(zip(i, v)))
        for t, c, (i, v) in zip(tokens, chosen.tolist(), best)
    )


def check_top(value, name: str = "logprobs") -> int | None:
    """GenerationParams.logprobs (or `name`): None (off) or 0 .. MAX_TOP_LOGPROBS
    alternatives."""
    if value is None:
        return None
    if not is_int(value, 0) or value > MAX_TOP_LOGPROBS:
        from ..errors import ParameterError

        raise ParameterError(
            f"{name} must be None or an int in [0, {MAX_TOP_LOGPROBS}] (the top alternatives "
            f"to return), got {value!r}"
        )
    return value
