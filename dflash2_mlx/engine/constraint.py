"""Constrained generation: which tokens may come next, applied at every verified position.

A `TokenConstraint` (one per generation; grammar.py builds them from a JSON schema) says
which tokens the grammar allows after the committed tokens and after each prefix of a
round's drafts, and what it forces next (proposed as drafts). The verify forward's logits
are masked row by row before acceptance, so a round accepts exactly what plain decoding over
the masked logits would pick, one token at a time: a draft the grammar forbids has
probability 0 and is rejected, and the bonus token is drawn from the masked distribution.
Drafts stay unconstrained (they only need verifying).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import mlx.core as mx
import numpy as np


class TokenConstraint(Protocol):
    def allowed(self, drafts: Sequence[int]) -> np.ndarray:
        """bool [len(drafts) + 1, V]: row j holds the tokens allowed after the committed
        tokens and drafts[:j]. Rows past the first forbidden draft are never used (any
        non-empty row will do)."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """The generation committed `tokens` (each one allowed where it stands)."""
        ...

    def forced(self) -> list[int]:
        """Tokens that spell what the grammar forces next (e.g. a schema's next key), [] if
        nothing is: proposed as drafts, like a lookup match (no draft pass)."""
        ...

    # Optional, `on_stop() -> None`: a stop token ended the generation; raises
    # (ParameterError) when the committed text is incomplete (`ended` calls it where defined).


def ended(constraint) -> None:
    """The generation stopped on a stop token: a constraint that can tell checks its text is
    complete (grammar.py's: a stuck grammar allows the stop token too)."""
    on_stop = getattr(constraint, "on_stop", None)
    if callable(on_stop):
        on_stop()


CONSTRAINT_METHODS = ("allowed", "commit", "forced")  # what a factory's constraint must have

# What GenerationParams carries: called once per generation for its own constraint state. A
# factory with a `stop_ids` set (grammar.py's) allows only those once its text is complete:
# the generation must stop on them.
ConstraintFactory = Callable[[], TokenConstraint]


def constrain(
    logits: mx.array, constraint: TokenConstraint | None, drafts: Sequence[int] = ()
) -> mx.array:
    """logits [len(drafts) + 1, V] of a round's positions, the forbidden tokens at -inf."""
    if constraint is None:
        return logits
    mx.async_eval(logits)  # the forward runs while the masks are computed
    allowed = constraint.allowed(list(drafts))
    width = logits.shape[-1]
    if allowed.shape[-1] < width:  # ids past the constraint's vocabulary are never allowed
        allowed = np.pad(allowed, [(0, 0), (0, width - allowed.shape[-1])])
    return mx.where(mx.array(allowed[:, :width]), logits, -mx.inf)
