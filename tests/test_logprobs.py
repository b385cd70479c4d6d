"""Log-probabilities of committed tokens: what mlx-lm's plain decoding reports for them.

Every committed token's log-probability (and the most likely alternatives) is read off the
row of the verify forward that checked it; `mlx_lm.generate_step` yields the same
distribution one token at a time. Compared within float tolerance (a wider matmul rounds
differently), on dense and hybrid targets, with drafts accepted and refused, with logits
processors, alone and batched.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import tiny
from test_processors import PROMPTS

from dflash2_mlx import GenerationParams, ParameterError, SpeculativeDecoder
from dflash2_mlx.api import Pair
from dflash2_mlx.engine.processors import penalties
from dflash2_mlx.target.adapter import TargetAdapter

TOP = 4


def mlx_lm_logprobs(model, prompt, n, processors=()):
    """mlx-lm's greedy tokens and each one's full log-probability row."""
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), model, max_tokens=n, logits_processors=list(processors))
    return [(int(tok), np.array(lp)) for tok, lp in steps]


def check(events, ref, top=TOP):
    got = [lp for ev in events for lp in ev.logprobs]
    assert [lp.token for lp in got] == [t for t, _ in ref]
    assert [t for ev in events for t in ev.tokens] == [t for t, _ in ref]
    for lp, (tok, row) in zip(got, ref):
        assert abs(lp.logprob - row[tok]) < 1e-3, (lp.logprob, row[tok])
        assert len(lp.top) == top
        ids, vals = [i for i, _ in lp.top], [v for _, v in lp.top]
        assert vals == sorted(vals, reverse=True)
        np.testing.assert_allclose(vals, np.sort(row)[::-1][:top], atol=1e-3)
        np.testing.assert_allclose(row[ids], vals, atol=1e-3)  # ids and values belong together


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen3_5"])
def decoder(request):
    model = tiny.make_target(request.param)
    drafter = tiny.make_drafter(2)
    return model, SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)


def test_logprobs_equal_mlx_lm_plain_decoding(decoder):
    model, dec = decoder
    procs = penalties(tiny.VOCAB, repetition_penalty=1.6, logit_bias={4: 2.0})
    for prompt in PROMPTS:
        for processors in ((), procs):
            ref = mlx_lm_logprobs(model, prompt, 20, processors)
            predicted = tuple(t for t, _ in ref)  # accepted through many rows
            for block, prediction in ((2, ()), (8, ()), (4, predicted)):
                params = GenerationParams(
                    max_tokens=20,
                    block_size=block,
                    prediction=prediction,
                    logits_processors=processors,
                    logprobs=TOP,
                )
                events = list(dec.stream(prompt, params))
                check(events, ref)
                assert events[0].prefill and len(events[0].logprobs) == 1
    off = list(dec.stream(PROMPTS[0], GenerationParams(max_tokens=6)))
    assert all(ev.logprobs == () for ev in off)
    zero = list(dec.stream(PROMPTS[0], GenerationParams(max_tokens=6, logprobs=0)))
    assert all(lp.top == () for ev in zero for lp in ev.logprobs)
    assert sum(len(ev.logprobs) for ev in zero) == 6


def test_batched_rows_carry_their_own_logprobs(decoder):
    model, dec = decoder
    pair = Pair(model, None, dec.drafter, dec)
    prompts = PROMPTS + [[7, 7, 1, 2]]
    refs = [mlx_lm_logprobs(model, p, n) for p, n in zip(prompts, (14, 9, 17))]
    params = [
        GenerationParams(max_tokens=14, logprobs=TOP, prediction=tuple(t for t, _ in refs[0])),
        GenerationParams(max_tokens=9),
        GenerationParams(max_tokens=17, logprobs=TOP),
    ]
    batch = pair.batch(max_batch=3)
    events: dict[int, list] = {}
    for i, ev in batch.stream(zip(prompts, params)):
        events.setdefault(i, []).append(ev)
    check(events[0], refs[0])
    check(events[2], refs[2])
    assert all(ev.logprobs == () for ev in events[1])
    assert max(ev.batch_size for ev in events[0]) == 3


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0])
def test_bad_logprobs_are_refused(bad):
    with pytest.raises(ParameterError, match="logprobs must be None or an int in"):
        GenerationParams(logprobs=bad)
