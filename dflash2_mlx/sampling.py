"""Sampling parameters and filters: the target distribution p, as mlx-lm's sampler draws it
(top_p and min_p on the untempered distribution, then top_k, then the temperature over the
tokens kept), and draws from it. A leaf module: the drafter samples
its walks with it, the engine verifies against it (engine/acceptance.py)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import mlx.core as mx

from .errors import ParameterError
from .values import is_int, is_number

# Below this temperature the distribution is numerically argmax already (two distinct fp32
# logits differ by far more than 1e-30 * 87, where exp underflows), while logits / T would
# overflow float32 (1e-38, 1e-46: a vocabulary of NaNs); so it is greedy.
GREEDY_BELOW = 1e-30


SEEDS = 2**64  # what mx.random.key takes (a uint64)
# top_p's nucleus is looked for among this many most likely tokens first (see nucleus)
NUCLEUS_CANDIDATES = 1024

# field -> (test of a value, what a valid value is): one rule per field, used by
# SamplingParams and by front ends that check one field at a time (flags, request fields).
_CHECKS = {
    "temperature": (
        lambda v: is_number(v) and math.isfinite(v) and v >= 0,
        "temperature must be a finite number >= 0",
    ),
    "top_p": (
        lambda v: is_number(v) and 0 <= v <= 1,
        "top_p must be in [0, 1] (0: the most likely token only)",
    ),
    "top_k": (lambda v: is_int(v, 0), "top_k must be an int >= 0 (0 = off)"),
    "min_p": (lambda v: is_number(v) and 0 <= v <= 1, "min_p must be in [0, 1]"),
    "seed": (
        lambda v: v is None or (is_int(v, 0) and v < SEEDS),
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
                raise ParameterError(f"{problem}; got {name}={getattr(self, name)!r}")
        if self.temperature < GREEDY_BELOW:  # the T -> 0 limit: exactly greedy (see above)
            object.__setattr__(self, "temperature", 0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered_probs(logits: mx.array, params: SamplingParams) -> mx.array:
    """[..., V] logits -> [..., V] fp32 probabilities, as mlx-lm's sampler (make_sampler)
    draws: top_p and min_p cut the untempered distribution, top_k keeps the k likeliest of
    what is left, and the temperature shapes the tokens kept. Greedy (temperature 0): the
    T -> 0 limit, one-hot on the argmax."""
    scores = logits.astype(mx.float32)
    vocab = scores.shape[-1]
    if params.greedy:
        return (mx.arange(vocab) == mx.argmax(scores, axis=-1, keepdims=True)).astype(mx.float32)
    # Shift first (softmax is shift-invariant): the top row is exactly 0, never inf - inf.
    scores = scores - mx.max(scores, axis=-1, keepdims=True)
    keep = None
    if params.top_p < 1.0:
        keep = nucleus(mx.softmax(scores, axis=-1), params.top_p, top_k=params.top_k)
    if params.min_p > 0:  # p >= min_p * max p, the top's log-probability being 0 here
        above = scores >= math.log(params.min_p)
        keep = above if keep is None else keep & above
    if 0 < params.top_k < vocab:  # exactly k, as mlx-lm's apply_top_k: ties at the k-th cut
        left = scores if keep is None else mx.where(keep, scores, -mx.inf)
        drop = mx.argpartition(-left, kth=params.top_k - 1, axis=-1)[..., params.top_k :]
        top = mx.put_along_axis(mx.ones(scores.shape, mx.bool_), drop, mx.array(False), axis=-1)
        keep = top if keep is None else keep & top
    scores = scores / params.temperature
    return mx.softmax(scores if keep is None else mx.where(keep, scores, -mx.inf), axis=-1)


def nucleus(
    probs: mx.array, top_p: float, candidates: int = NUCLEUS_CANDIDATES, top_k: int = 0
) -> mx.array:
    """[..., V] mask of each row's top_p nucleus, as mlx-lm's apply_top_p: its most likely
    tokens while the mass before each is below top_p (the most likely always: a top_p below
    float32's range rounds to 0), and every token as likely as the last of them. Found among
    the `candidates` most likely tokens, a partial selection, where every row's nucleus is
    inside them; else by a full sort (5 ms a row of 49,152 on a CPU core, paid by every
    verified row of a sampled round). `top_k` > 0: only the k likeliest will be kept, so the
    nucleus is looked for among them alone (a mask that then holds the k likeliest at least,
    however wide the nucleus)."""
    if 0 < top_k < min(candidates, probs.shape[-1]):
        part = mx.argpartition(-probs, kth=top_k - 1, axis=-1)[..., :top_k]
        return probs >= _nucleus_edge(mx.take_along_axis(probs, part, axis=-1), top_p)[1]
    if candidates < probs.shape[-1]:
        part = mx.argpartition(-probs, kth=candidates - 1, axis=-1)[..., :candidates]
        keep, least = _nucleus_edge(mx.take_along_axis(probs, part, axis=-1), top_p)
        if not mx.any(keep[..., -1]).item():  # the last candidate is out: so is every later one
            return probs >= least
    return probs >= _nucleus_edge(probs, top_p)[1]


def _nucleus_edge(probs: mx.array, top_p: float):
    """(keep, least): which of `probs` sorted in descending order the nucleus keeps (a
    prefix), and the probability of the last one kept [..., 1]."""
    sorted_p = -mx.sort(-probs, axis=-1)
    keep = (mx.cumsum(sorted_p, axis=-1) - sorted_p) < top_p
    keep = keep | (mx.arange(keep.shape[-1]) == 0)
    last = mx.sum(keep, axis=-1, keepdims=True) - 1
    return keep, mx.take_along_axis(sorted_p, last, axis=-1)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """Draw one id per row of [..., V] probabilities."""
    return mx.random.categorical(mx.log(probs), key=key)


def pick(logits: mx.array, params: SamplingParams, key: mx.array) -> mx.array:
    """Next token from [..., V] logits: argmax when greedy, else a draw from p."""
    if params.greedy:
        return mx.argmax(logits, axis=-1)
    return sample(filtered_probs(logits, params), key)
