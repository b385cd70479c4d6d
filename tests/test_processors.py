"""Logits processors (penalties, logit bias): the output is exactly plain decoding with them.

Each verified row is processed with the tokens before it (the committed ones and the round's
drafts up to it). Checked against mlx-lm's own `generate_step` with the same processors, on
dense and hybrid targets, alone and batched, with drafts accepted through many rows (the
prediction proposes the reference itself) and refused; sampled output follows the processed
distribution.
"""

from __future__ import annotations

import re
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
import tiny
from test_sampling import PROMPT, V, empirical, tv

from dflash2_mlx import GenerationParams, ParameterError, SamplingParams, SpeculativeDecoder
from dflash2_mlx.api import Pair
from dflash2_mlx.engine.processors import check_penalty, penalties
from dflash2_mlx.sampling import filtered_probs
from dflash2_mlx.target.adapter import TargetAdapter

PROMPTS = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 2, 7, 1, 8]]
SETTINGS = [
    {"repetition_penalty": 1.8, "repetition_context_size": 6},
    {"presence_penalty": 1.5, "frequency_penalty": 0.7},
    {"logit_bias": {4: 3.0, 11: -50.0}, "repetition_penalty": 1.3},
]


def mlx_lm_reference(model, prompt, n, processors) -> list[int]:
    """mlx-lm's plain greedy decoding with the same logits processors."""
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(
        mx.array(prompt), model, max_tokens=n, logits_processors=list(processors)
    ):
        out.append(int(tok))
    return out


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen3_5"])
def decoder(request):
    model = tiny.make_target(request.param)
    drafter = tiny.make_drafter(2)
    return model, SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)


@pytest.mark.parametrize("setting", SETTINGS, ids=["repetition", "presence+frequency", "bias"])
def test_processed_greedy_equals_mlx_lm_with_the_same_processors(decoder, setting):
    model, dec = decoder
    for prompt in PROMPTS:
        procs = penalties(tiny.VOCAB, len(prompt), **setting)
        ref = mlx_lm_reference(model, prompt, 24, procs)
        assert ref != tiny.greedy_reference(model, prompt, 24), "the processors should matter"
        # The reference as a prediction is accepted through many rows, each processed after
        # its own drafts; one with a wrong token in it is refused there.
        bad = ref[:5] + [(ref[5] + 1) % tiny.VOCAB] + ref[6:]
        for block, predicted in ((2, ()), (5, ()), (8, ()), (4, tuple(ref)), (4, tuple(bad))):
            params = GenerationParams(
                max_tokens=24, block_size=block, prediction=predicted, logits_processors=procs
            )
            events = list(dec.stream(prompt, params))
            assert [t for ev in events for t in ev.tokens] == ref, (block, prompt)
            if predicted == tuple(ref):
                assert max(ev.accepted for ev in events) >= 8


def test_batched_rows_each_keep_their_own_processors(decoder):
    model, dec = decoder
    pair = Pair(model, None, dec.drafter, dec)
    prompts = PROMPTS + [[7, 7, 1, 2]]
    procs = [penalties(tiny.VOCAB, **SETTINGS[0]), (), penalties(tiny.VOCAB, **SETTINGS[2])]
    expected = [mlx_lm_reference(model, p, n, pr) for p, n, pr in zip(prompts, (16, 12, 20), procs)]
    params = [  # the first row's prediction is accepted through many processed rows
        GenerationParams(max_tokens=16, prediction=tuple(expected[0]), logits_processors=procs[0]),
        GenerationParams(max_tokens=12),
        GenerationParams(max_tokens=20, logits_processors=procs[2]),
    ]
    results = pair.generate_batch(prompts, params, max_batch=3)
    assert [out for out, _ in results] == expected
    assert results[0][1].accepted >= 8


def test_bad_settings_are_refused_naming_the_field():
    cases = [
        ({"repetition_penalty": 0}, "repetition_penalty: must be a number in [0.01, 100.0]"),
        ({"repetition_penalty": "high"}, "repetition_penalty: must be a number in"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty: must be a number in"),
        ({"repetition_context_size": 0}, "repetition_context_size: must be an int in [1, "),
        ({"repetition_context_size": 2**40}, "repetition_context_size: must be an int in [1, "),
        ({"repetition_context_size": 2.0}, "repetition_context_size: must be an int in [1, "),
        ({"presence_penalty": True}, "presence_penalty: must be a number in [-2.0, 2.0]"),
        ({"presence_penalty": 10**400}, "presence_penalty: must be a number in [-2.0, 2.0]"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty: must be a number in"),
        (
            {"logit_bias": {tiny.VOCAB: 1.0}},
            f"logit_bias: token ids must be ints in [0, {tiny.VOCAB})",
        ),
        ({"logit_bias": {3: None}}, "logit_bias: must be a number in [-100.0, 100.0]"),
        ({"logit_bias": {3: float("-inf")}}, "logit_bias: must be a number in [-100.0, 100.0]"),
        ({"logit_bias": [3]}, "logit_bias: must be a mapping"),
        ({"top_a": 1.0}, "unknown penalty 'top_a'"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(ParameterError, match=re.escape(needle)):
            penalties(tiny.VOCAB, **kwargs)
    with pytest.raises(ParameterError, match="logits_processors"):
        GenerationParams(logits_processors=[5])  # a list is fine (mlx-lm's), of callables
    with pytest.raises(ParameterError, match="vocab must be the vocabulary size"):
        penalties("x", repetition_penalty=1.2)
    neutral = dict(repetition_penalty=1, presence_penalty=0, frequency_penalty=0.0, logit_bias={})
    assert penalties(tiny.VOCAB, **neutral) == ()
    # NumPy ids, as prompts take them; a string id is no id
    assert check_penalty("logit_bias", {np.int64(4): 3}, tiny.VOCAB) == {4: 3.0}
    with pytest.raises(ParameterError, match=re.escape("token ids must be ints in [0, ")):
        check_penalty("logit_bias", {"4": 3}, tiny.VOCAB)


def test_presence_and_frequency_count_the_completion_only_with_no_window():
    """OpenAI's formula: logit[t] -= frequency * count[t] + presence * (count[t] > 0), count
    over every generated token (not the prompt's, however far back)."""
    prompt = [5, 5, 5, 9]
    generated = [7] + [3] * 30 + [7, 11]  # 7 twice, once 31 tokens back
    (proc,) = penalties(tiny.VOCAB, len(prompt), presence_penalty=0.5, frequency_penalty=0.25)
    logits = mx.zeros((1, tiny.VOCAB))
    out = np.array(proc(mx.array(prompt + generated), logits))[0]
    expected = np.zeros(tiny.VOCAB)
    for t in set(generated):
        expected[t] = -(0.25 * generated.count(t) + 0.5)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert proc(mx.array(prompt), logits) is logits  # nothing generated yet: untouched
    with pytest.raises(ParameterError, match="prompt_tokens must be an int >= 0, got -1"):
        penalties(tiny.VOCAB, -1, presence_penalty=0.5)
    with pytest.raises(ParameterError, match="give prompt_tokens"):
        penalties(tiny.VOCAB, frequency_penalty=0.5)


def exact_processed_marginals(model, sp: SamplingParams, procs, prompt=PROMPT):
    """Exact P(t1), P(t2) after `prompt` with each position's logits processed."""

    def processed(logits, history):
        for p in procs:
            logits = p(mx.array(history), logits)
        return logits

    first = processed(model(mx.array([prompt]))[:, -1], prompt)
    p1 = np.array(filtered_probs(first, sp))[0]
    seconds = model(mx.array([prompt + [a] for a in range(V)]))[:, -1]
    rows = [processed(seconds[a : a + 1], prompt + [a]) for a in range(V)]
    p2 = np.array(filtered_probs(mx.concatenate(rows), sp))
    return p1, (p1[:, None] * p2).sum(0)


@pytest.mark.slow
def test_processed_sampling_follows_the_processed_distribution():
    model = tiny.make_target("llama", vocab=V, seed=11)
    drafter = tiny.make_drafter(2, vocab=V, mask_token_id=V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    sp = SamplingParams(temperature=1.0)
    procs = penalties(V, repetition_penalty=3.0, logit_bias={4: -3.0, 7: 2.0})

    class Processed:
        def generate(self, prompt, params):
            return dec.generate(prompt, replace(params, logits_processors=procs))

    emp = empirical(Processed(), sp, 1000)
    exact = exact_processed_marginals(model, sp, procs)
    plain = exact_processed_marginals(model, sp, ())
    for i in range(2):
        assert tv(exact[i], plain[i]) > 0.15, "the processors should move the distribution"
        assert tv(emp[i], exact[i]) < 0.09, (i, tv(emp[i], exact[i]))
