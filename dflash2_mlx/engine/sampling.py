"""Sampling filters and lossless (Leviathan) rejection sampling.

The target distribution is p = filter(softmax(logits / T)) with, in order, top_k, top_p and
min_p. Plain decoding samples from p; speculative decoding accepts a draft d with probability
min(1, p(d) / q(d)) and otherwise samples the normalized residual max(p - q, 0), so every
committed token follows p exactly. DFlash2's q lives on K candidates (sparse).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import mlx.core as mx

from ..errors import ParameterError

# Below this temperature the distribution is numerically argmax already (two distinct fp32
# logits differ by far more than 1e-30 * 87, where exp underflows), while logits / T would
# overflow float32 (1e-38, 1e-46: a vocabulary of NaNs); so it is greedy.
GREEDY_BELOW = 1e-30


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


SEEDS = 2**64  # what mx.random.key takes (a uint64)

# field -> (test of a value, what a valid value is): one rule per field, used by
# SamplingParams and by front ends that check one field at a time (flags, request fields).
_CHECKS = {
    "temperature": (
        lambda v: _is_number(v) and math.isfinite(v) and v >= 0,
        "temperature must be a finite number >= 0",
    ),
    "top_p": (
        lambda v: _is_number(v) and 0 <= v <= 1,
        "top_p must be in [0, 1] (0: the most likely token only)",
    ),
    "top_k": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "top_k must be an int >= 0 (0 = off)",
    ),
    "min_p": (lambda v: _is_number(v) and 0 <= v < 1, "min_p must be in [0, 1)"),
    "seed": (
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < SEEDS),
        "seed must be an int in [0, 2**64)",
    ),
}


def plain_number(value):
    """A NumPy (or other numbers.Real) scalar as a Python int or float; anything else as it
    is (its field's check then says what is wrong)."""
    if isinstance(value, (bool, int, float)) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def field_problem(name: str, value) -> str | None:
    """What is wrong with `value` for SamplingParams field `name`, or None if it is valid."""
    ok, rule = _CHECKS[name]
    return None if ok(value) else rule


@dataclass(frozen=True)
class SamplingParams:
    """The target's sampler: temperature 0 is greedy (the default); top_p, top_k (0: off) and
    min_p filter as mlx-lm's do; `seed` makes a sampled reply reproducible (None: MLX's global
    random state). Out-of-range values are a ParameterError naming the field."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        for name in _CHECKS:  # NumPy scalars as Python numbers (then checked as those)
            object.__setattr__(self, name, plain_number(getattr(self, name)))
        for name in _CHECKS:
            problem = field_problem(name, getattr(self, name))
            if problem:
                raise ParameterError(f"{problem}; got {self._describe()}")
        if self.temperature < GREEDY_BELOW:  # the T -> 0 limit: exactly greedy (see above)
            object.__setattr__(self, "temperature", 0.0)

    def _describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered_probs(logits: mx.array, params: SamplingParams) -> mx.array:
    """[..., V] logits -> [..., V] fp32 probabilities after temperature, top_k, top_p, min_p.
    Greedy (temperature 0): the T -> 0 limit, one-hot on the argmax."""
    scores = logits.astype(mx.float32)
    if params.greedy:
        vocab = scores.shape[-1]
        return (mx.arange(vocab) == mx.argmax(scores, axis=-1, keepdims=True)).astype(mx.float32)
    # Shift first (softmax is shift-invariant): the top row is exactly 0, never inf - inf.
    scores = (scores - mx.max(scores, axis=-1, keepdims=True)) / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = mx.sort(scores, axis=-1)[..., vocab - params.top_k][..., None]
        scores = mx.where(scores >= kth, scores, -mx.inf)
    probs = mx.softmax(scores, axis=-1)
    if params.top_p < 1.0:
        order = mx.argsort(-probs, axis=-1)
        sorted_p = mx.take_along_axis(probs, order, axis=-1)
        keep_sorted = (mx.cumsum(sorted_p, axis=-1) - sorted_p) < params.top_p
        # The most likely token is always kept: a top_p below float32's range rounds to 0.
        keep_sorted = keep_sorted | (mx.arange(keep_sorted.shape[-1]) == 0)
        keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
        probs = mx.where(keep, probs, 0.0)
    if params.min_p > 0:
        probs = mx.where(probs >= params.min_p * mx.max(probs, axis=-1, keepdims=True), probs, 0.0)
    return probs / mx.sum(probs, axis=-1, keepdims=True)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """Draw one id per row of [..., V] probabilities."""
    return mx.random.categorical(mx.log(probs), key=key)


def pick(logits: mx.array, params: SamplingParams, key: mx.array) -> mx.array:
    """Next token from [..., V] logits: argmax when greedy, else a draw from p."""
    if params.greedy:
        return mx.argmax(logits, axis=-1)
    return sample(filtered_probs(logits, params), key)


def rejection_sample(
    drafts: mx.array, p: mx.array, q: mx.array, candidates: mx.array | None, key: mx.array
) -> tuple[int, int]:
    """drafts [γ]; p [γ+1, V] target probs; q [γ, V] (dense) or [γ, K] over `candidates` [γ, K]
    (distinct ids per row: DFlash2's top-K, or a draft vocabulary).
    Returns (accepted count a, bonus token)."""
    gamma = drafts.shape[0]
    k_accept, k_bonus = mx.random.split(key)
    p_d = mx.take_along_axis(p[:gamma], drafts[:, None], axis=-1)[:, 0]
    if candidates is None:
        q_d = mx.take_along_axis(q, drafts[:, None], axis=-1)[:, 0]
    else:
        q_d = mx.sum(mx.where(candidates == drafts[:, None], q, 0.0), axis=-1)
    u = mx.random.uniform(shape=(gamma,), key=k_accept)
    ok = (u * q_d < p_d).astype(mx.int32)
    accepted = int(mx.sum(mx.cumprod(ok)).item())
    if accepted == gamma:
        return accepted, int(sample(p[gamma], k_bonus).item())
    row = p[accepted]
    if candidates is None:
        residual = row - q[accepted]
    else:
        # .add: an id listed twice has both its masses taken off, as q_d above counts them
        residual = row.at[candidates[accepted]].add(-q[accepted])
    residual = mx.maximum(residual, 0.0)
    total = mx.sum(residual)
    residual = mx.where(total > 0, residual / mx.maximum(total, 1e-30), row)
    return accepted, int(sample(residual, k_bonus).item())


def accept(logits: mx.array, proposal, sp: SamplingParams, key) -> tuple[int, int]:
    """Verify `proposal` (an engine.proposal.Proposal; not imported: the drafter imports this
    module) against the target's logits [γ+1, V] of [anchor] + drafts:
    (drafts accepted, bonus token) by greedy match or lossless rejection sampling."""
    drafts = proposal.drafts
    if sp.greedy:
        target_ids = mx.argmax(logits, axis=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == target_ids[accepted]:
            accepted += 1
        return accepted, target_ids[accepted]
    if drafts:
        return rejection_sample(
            mx.array(drafts), filtered_probs(logits, sp), proposal.q, proposal.candidates, key
        )
    return 0, int(pick(logits[-1], sp, key).item())
