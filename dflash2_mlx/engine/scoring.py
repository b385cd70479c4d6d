"""A prompt's own log-probabilities: how likely the target finds each prompt token after
the ones before it (an evaluation's loglikelihood; a completion's `echo` with `logprobs`).

The target reads the prompt a chunk at a time into caches of its own (a generation's session
and the prompt cache are not touched) and every row's logits are kept, where a generation's
prefill keeps only the last. The numbers are `mlx_lm`'s: the model's own forward, the raw
distribution (no penalties, no temperature), up to the float rounding of the chunking.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from ..errors import ParameterError
from ..target.adapter import TargetAdapter
from .logprobs import TokenLogprob, check_top, token_logprobs

SCORING_CHUNK = 256  # prompt tokens a forward: the logits of a chunk are chunk x vocab floats


class PromptScoring:
    """Scores `prompt` a chunk per `advance`; once `done`, `result` holds one TokenLogprob per
    prompt token after the first (the first has no context to be scored in), with the `top`
    likeliest tokens at each position."""

    def __init__(self, target: TargetAdapter, prompt: Sequence[int], top: int = 0):
        self.prompt = [int(t) for t in prompt]
        if not self.prompt:
            raise ParameterError("the prompt to score is empty")
        bad = [t for t in self.prompt if not 0 <= t < target.vocab_size]
        if bad:
            raise ParameterError(
                f"prompt token id {bad[0]} is out of range for a vocabulary of "
                f"{target.vocab_size} ids"
            )
        self.target, self.top = target, check_top(top, "top") or 0
        self.cache = target.make_cache()
        self.fed = 0
        self.result: list[TokenLogprob] = []

    @property
    def done(self) -> bool:
        return self.fed >= len(self.prompt)

    def advance(self, chunk: int = SCORING_CHUNK) -> int:
        """Run the next `chunk` prompt tokens; returns how many."""
        start, end = self.fed, min(self.fed + chunk, len(self.prompt))
        logits = self.target.model(mx.array(self.prompt[start:end])[None], cache=self.cache)
        # row i predicts token start + i + 1: the last row of the prompt predicts nothing in it
        following = self.prompt[start + 1 : end + 1]
        self.result.extend(token_logprobs(logits[0], following, self.top))
        mx.eval([c.state for c in self.cache])
        self.fed = end
        return end - start

    def run(self, chunk: int = SCORING_CHUNK) -> list[TokenLogprob]:
        while not self.done:
            self.advance(chunk)
        return self.result
