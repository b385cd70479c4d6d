"""A drafter whose drafts are seldom accepted backs off (engine/generation.py BACKOFF_*): its
rounds verify the anchor alone, with a probe every PROBE_EVERY rounds; the output stays plain
decoding's (greedy token for token) and a seeded request returns in a batch what it returns
alone, since its own acceptance alone decides it.

A drafter of random weights against a random target has its drafts accepted about never; the
token comparisons are argmaxes and seeded draws of sharpened tiny targets, as test_batch.py."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny

from dflash2_mlx import GenerationParams, SamplingParams, SpeculativeDecoder
from dflash2_mlx.engine.batch import BatchDecoder
from dflash2_mlx.engine.generation import BACKOFF_AFTER, PROBE_EVERY, _Run
from dflash2_mlx.target.adapter import TargetAdapter

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 30, 31]]


def run_of(block: int = 4) -> _Run:
    return _Run(GenerationParams(max_tokens=500), block, 1, mx.random.key(0))


def test_the_drafter_backs_off_below_the_rate_and_probes():
    run = run_of()
    for _ in range(BACKOFF_AFTER - 1):  # too few rounds to judge: it drafts
        assert run.drafter_span(10) == 4
        run.observe("drafter", 3, 0)
    assert run.drafter_span(10) == 4
    run.observe("drafter", 3, 0)
    spans = []
    for _ in range(2 * PROBE_EVERY):
        spans.append(run.drafter_span(10))
        run.observe("drafter", spans[-1] - 1, 0)
    probes = [i for i, s in enumerate(spans) if s == 4]
    assert probes == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1] and set(spans) == {1, 4}
    good = run_of()
    for _ in range(3 * BACKOFF_AFTER):  # half its drafts accepted: it never backs off
        assert good.drafter_span(10) == 4
        good.observe("drafter", 3, 2)
    lookups = run_of()
    for _ in range(3 * BACKOFF_AFTER):  # other sources' rounds do not count as the drafter's
        lookups.observe("lookup", 7, 0)
    assert lookups.drafter_span(10) == 4


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def decoder(request):
    model = tiny.make_target(request.param)
    drafter = tiny.make_drafter(2, block_size=4)  # random: its drafts are all but never accepted
    return SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)


def test_a_backed_off_greedy_generation_is_plain_greedy(decoder):
    params = GenerationParams(max_tokens=60)
    events = list(decoder.stream(PROMPTS[0], params))
    tokens = [t for ev in events for t in ev.tokens]
    assert tokens == tiny.greedy_reference(decoder.target.model, PROMPTS[0], 60)
    rounds = [ev for ev in events if not ev.prefill and ev.source == "drafter"]
    idle = [ev for ev in rounds if ev.drafted == 0]
    assert len(idle) > len(rounds) // 2, "a drafter accepted about never should back off"
    assert sum(ev.drafted > 0 for ev in rounds) >= BACKOFF_AFTER + 2  # it keeps probing


def test_a_seeded_request_backs_off_alike_in_a_batch(decoder):
    params = [
        GenerationParams(max_tokens=50, sampling=SamplingParams(1.3, seed=5)),
        GenerationParams(max_tokens=40, sampling=SamplingParams(0.9, seed=8)),
    ]
    alone = [decoder.generate(p, g) for p, g in zip(PROMPTS, params)]
    out: list[list[int]] = [[] for _ in PROMPTS]
    for i, ev in BatchDecoder(decoder, max_batch=2).stream(zip(PROMPTS, params)):
        out[i].extend(ev.tokens)
    assert out == alone


def test_backoff_false_drafts_every_round_as_measurements_need(decoder):
    """The autotuner and `dflash2 evaluate` measure what a block does: no back-off there."""
    from dflash2_mlx import ParameterError

    params = GenerationParams(max_tokens=40, backoff=False)
    events = [ev for ev in decoder.stream(PROMPTS[0], params) if not ev.prefill]
    assert all(
        ev.drafted > 0 for ev in events if ev.source == "drafter" and ev.finish_reason is None
    )
    with pytest.raises(ParameterError, match="backoff must be True or False"):
        GenerationParams(backoff="no")
