"""The draft gate (engine/gate.py): greedy rounds decode plainly where the drafter does not pay
for itself, and output stays exactly the target's greedy decoding either way."""

import pytest
import tiny

from dflash2_mlx import GenerationParams, GenerationStats, SamplingParams, SpeculativeDecoder
from dflash2_mlx.engine.gate import DraftGate
from dflash2_mlx.target.adapter import TargetAdapter

PROMPTS = [[3, 14, 15, 9, 26], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9]]


def test_a_drafter_that_is_never_accepted_gives_way_to_plain_rounds():
    gate = DraftGate()
    assert gate.draft(4)  # nothing measured: draft
    for _ in range(3):
        gate.observe("drafter", 3, 0, 150.0)
    assert not gate.draft(4)  # p has fallen: ~1 token per 150 ms loses to plain decoding
    for _ in range(gate.probe_after - 1):
        gate.observe("drafter", 0, 0, 110.0)
        assert not gate.draft(4)
    gate.observe("drafter", 0, 0, 110.0)
    assert gate.draft(4)  # a probe re-measures the drafter
    gate.observe("drafter", 3, 0, 150.0)  # it still does not pay: the next probe waits longer
    assert gate.failed_probes == 1
    for _ in range(2 * gate.probe_after - 1):
        gate.observe("drafter", 0, 0, 110.0)
        assert not gate.draft(4)
    gate.observe("drafter", 0, 0, 110.0)
    assert gate.draft(4)


def test_a_drafter_that_is_accepted_keeps_drafting():
    gate = DraftGate()
    for _ in range(10):
        gate.observe("drafter", 3, 2, 150.0)  # ~2.5 tokens per 150 ms
        gate.observe("drafter", 0, 0, 110.0)
        assert gate.draft(4)
    assert gate.failed_probes == 0


def test_costs_decide_when_acceptance_is_middling():
    cheap, dear = DraftGate(), DraftGate()
    for gate, plain_ms in ((cheap, 60.0), (dear, 140.0)):
        for _ in range(6):
            gate.observe("drafter", 3, 1, 150.0)  # p ~ 0.5: ~1.9 tokens per round
        gate.observe("drafter", 0, 0, plain_ms)
    assert not cheap.draft(4)  # plain decoding at 60 ms a token beats 1.9 per 150 ms
    assert dear.draft(4)
    assert cheap.draft(1) is False


def test_model_free_rounds_leave_the_gate_alone():
    gate = DraftGate()
    gate.observe("lookup", 7, 0, 200.0)
    gate.observe("datastore", 4, 1, 160.0)
    assert gate.accepted == gate.rejected == 0.0 and not gate.drafter_ms


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def random_pair(request):
    model = tiny.make_target(request.param)
    drafter = tiny.make_drafter(2)  # random: its drafts are (almost) never accepted
    return model, SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)


def test_greedy_output_is_the_same_with_plain_rounds(random_pair):
    model, dec = random_pair
    for prompt in PROMPTS:
        ref = tiny.greedy_reference(model, prompt, 40)
        stats = GenerationStats()
        out = []
        for ev in dec.stream(prompt, GenerationParams(max_tokens=40, block_size=4)):
            stats.add(ev)
            out.extend(ev.tokens)
        assert out == ref
        assert stats.plain_rounds > 0, "the gate never chose a plain round"
        assert stats.drafted > 0, "the gate never drafted"
        off = GenerationParams(max_tokens=40, block_size=4, draft_gate=False)
        stats_off = GenerationStats()
        for ev in dec.stream(prompt, off):
            stats_off.add(ev)
        # the drafter every round when the gate is off (but a last round with room for one)
        assert stats_off.plain_rounds <= 1


def test_sampled_generations_always_draft(random_pair):
    _, dec = random_pair
    params = GenerationParams(
        max_tokens=30, block_size=4, sampling=SamplingParams(temperature=0.8, seed=5)
    )
    stats = GenerationStats()
    runs = [[], []]
    for out in runs:
        for ev in dec.stream(PROMPTS[0], params):
            stats.add(ev)
            out.extend(ev.tokens)
    # never gated (a seeded request's draws must not depend on timing): at most each run's
    # last round, with room for one token, verifies the anchor alone
    assert stats.plain_rounds <= len(runs)
    assert runs[0] == runs[1]
