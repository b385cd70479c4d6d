"""Predicted outputs: drafts from a caller's guess of the answer (still exactly the target)."""

import numpy as np
import pytest
import tiny
from test_sampling import V as SAMPLING_V
from test_sampling import exact_marginals, tv

from dflash2_mlx import GenerationParams, GenerationStats, ParameterError, SamplingParams
from dflash2_mlx import SpeculativeDecoder
from dflash2_mlx.engine.lookup import PredictionLookup
from dflash2_mlx.target.adapter import TargetAdapter

PROMPT = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7]


def test_follows_the_prediction_and_resyncs_after_an_edit():
    pl = PredictionLookup([10, 11, 12, 13, 14, 15, 16, 17, 12, 13, 14, 20], min_match=2)
    pl.extend([10])
    assert pl.propose(3) == [11, 12, 13]  # aligned from the start
    pl.extend([11, 12])
    assert pl.propose(2) == [13, 14]
    pl.extend([99])  # the answer diverged: "12 99" occurs nowhere
    assert pl.propose(3) == []
    pl.extend([13, 14])
    assert pl.propose(3, resync=False) == []  # not aligned; a re-sync was not asked for
    pl.extend([13, 14])  # "13 14" occurs twice; the first at or after the aligned point 3
    assert pl.propose(3) == [15, 16, 17]
    pl.extend([15, 16, 17, 12, 13])
    assert pl.propose(4) == [14, 20]  # still aligned: the rest of the prediction
    assert PredictionLookup([1, 2]).propose(0) == []


def test_the_prediction_tokens_the_answer_followed_are_counted_once():
    """OpenAI's accepted_prediction_tokens: the prediction's tokens that appeared in the
    completion. An edit costs its own tokens; a re-sync counts the matched key; a repeat of
    the prediction's text counts nothing twice."""
    pl = PredictionLookup([10, 11, 12, 13, 14, 15, 16, 17], min_match=2)
    used = []
    for tokens in ([10], [11, 99], [13, 14], [15], [16, 17], [16, 17]):  # 12 became 99
        pl.extend(tokens)  # no propose: counted whoever drafted (context lookup, the drafter)
        used.append(pl.take_used())
    assert used == [1, 1, 2, 1, 2, 0]  # 10 | 11 | 13 14 (the re-sync key) | 15 | 16 17 | -
    assert sum(used) == 7 and pl.take_used() == 0  # all but 12


def _decoder(version=2, family="llama", **kw):
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(version, block_size=8)
    return model, SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, **kw
    )


@pytest.mark.parametrize("family,version", [("llama", 1), ("llama", 2), ("qwen3_5", 2)])
def test_greedy_with_a_prediction_equals_plain_decoding(family, version):
    model, dec = _decoder(version, family)
    ref = tiny.greedy_reference(model, PROMPT, 48)
    edited = ref[:20] + [1, 2] + ref[23:]  # an edit: two tokens replace three
    rng = np.random.default_rng(0)
    for prediction, kind in (
        (ref, "exact"),
        (edited, "edited"),
        (rng.integers(0, 90, 48).tolist(), "random"),
    ):
        for block in (3, 8):
            out, stats = [], GenerationStats()
            params = GenerationParams(max_tokens=48, block_size=block, prediction=tuple(prediction))
            for ev in dec.stream(PROMPT, params):
                stats.add(ev)
                out.extend(ev.tokens)
            assert out == ref, (family, version, block, kind)
            # At most 19 drafts precede the edit: more accepted means it re-synced after it.
            if kind == "edited":
                assert stats.prediction_accepted > 19, stats.as_dict()
            # the prediction's tokens that appeared in the answer, whoever drafted them (context
            # lookup on): all of the exact one, all but the edit's two, none of the random one
            used = {"exact": 48, "edited": 45, "random": 0}[kind]
            assert stats.prediction_tokens == len(prediction), stats.as_dict()
            assert stats.prediction_used == used or (kind == "random" and stats.prediction_used < 3)
    exact = GenerationStats()
    for ev in dec.stream(
        PROMPT, GenerationParams(max_tokens=48, block_size=8, lookup_block=8, prediction=tuple(ref))
    ):
        exact.add(ev)
    assert exact.prediction_accepted == exact.prediction_drafted == exact.accepted
    assert exact.rounds == 6  # 1 + 6 × 8 = 49 > 48: every round takes the whole block
    # Prediction rounds run no draft pass: by default they verify up to 16 tokens, past the
    # drafter's block (the last one cut to what max_tokens leaves), with the same output.
    events = list(
        dec.stream(PROMPT, GenerationParams(max_tokens=48, block_size=8, prediction=tuple(ref)))
    )
    assert [t for ev in events for t in ev.tokens] == ref
    assert [ev.block_size for ev in events[1:]] == [16, 16, 15]  # 1 + 16 + 16 + 15 = 48
    assert all(ev.source == "prediction" for ev in events[1:])


def test_the_next_generation_does_not_keep_the_prediction():
    model, dec = _decoder()
    session = dec.new_session()
    ref = tiny.greedy_reference(model, PROMPT, 16)
    dec.generate(PROMPT, GenerationParams(max_tokens=16, prediction=tuple(ref)), session)
    stats = GenerationStats()
    for ev in dec.stream(PROMPT, GenerationParams(max_tokens=16), session):
        stats.add(ev)
    assert stats.prediction_drafted == 0 and session.prediction is None


@pytest.mark.slow
def test_sampling_with_a_prediction_follows_the_target():
    """Predicted drafts are point masses too (accepted with probability p(x), else a draw from
    the residual): the first three tokens' marginals match the exact ones."""
    prompt = [1, 5, 3, 7, 2, 9, 4, 0, 6, 8]
    model = tiny.make_target("llama", vocab=SAMPLING_V, seed=11)
    drafter = tiny.make_drafter(2, vocab=SAMPLING_V, mask_token_id=SAMPLING_V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    sp = SamplingParams(temperature=1.0)
    guess = tuple(tiny.greedy_reference(model, prompt, 3))
    n, counts, stats = 1200, np.zeros((3, SAMPLING_V)), GenerationStats()
    for seed in range(n):
        params = GenerationParams(
            max_tokens=3, block_size=3, prediction=guess, sampling=SamplingParams(1.0, seed=seed)
        )
        out = []
        for ev in dec.stream(prompt, params):
            stats.add(ev)
            out.extend(ev.tokens)
        for i, t in enumerate(out):
            counts[i, t] += 1
    assert stats.prediction_drafted > n // 10  # it fired whenever the first token matched
    exact = exact_marginals(model, sp, prompt)
    for i in range(3):
        assert tv(counts[i] / n, exact[i]) < 0.085, (i, tv(counts[i] / n, exact[i]))


@pytest.mark.parametrize("bad", [(-1,), (1.5,), (True,), 7])
def test_bad_predictions_are_refused(bad):
    with pytest.raises(ParameterError, match=r"prediction(\[0\] = .* is not a token id| must be)"):
        GenerationParams(prediction=bad)


def test_out_of_vocabulary_predictions_are_refused():
    _, dec = _decoder()
    with pytest.raises(ParameterError, match=r"outside the vocabulary \[0, 96\)"):
        dec.generate(PROMPT, GenerationParams(max_tokens=4, prediction=(5, 96)))
