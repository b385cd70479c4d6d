"""Greedy speculative output must equal plain greedy decoding, token for token."""

import pytest
import tiny

from dflash2_mlx import GenerationParams, GenerationStats, SpeculativeDecoder
from dflash2_mlx.errors import CompatibilityError
from dflash2_mlx.engine.batch import BatchDecoder
from dflash2_mlx.target.adapter import TargetAdapter

PROMPTS = [
    [3, 14, 15, 9, 26],
    [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3, 6, 0, 2, 8, 7],  # > window 8
]
FIT_PROMPTS = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9], [2, 7, 1, 8, 2, 8, 1, 8], [60, 61, 62]]


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen3_5"])
def target(request):
    return request.param, tiny.make_target(request.param)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("layout", ["full", "sliding"])
def test_greedy_equals_plain_decoding(target, version, layout):
    family, model = target
    kw = (
        {}
        if layout == "full"
        else dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    )
    drafter = tiny.make_drafter(version, **kw)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    for prompt in PROMPTS:
        ref = tiny.greedy_reference(model, prompt, 24)
        for block in (2, 3, 5, 8, 16):
            out = dec.generate(prompt, GenerationParams(max_tokens=24, block_size=block))
            assert out == ref, (family, version, layout, block, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("version", [1, 2])
def test_lossless_with_accepted_drafts(family, version):
    """A drafter distilled on the target accepts drafts; output is still exactly greedy."""
    model = tiny.make_target(family)
    drafter = tiny.fit_drafter(
        model, tiny.make_drafter(version, block_size=8), FIT_PROMPTS, steps=150
    )
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    stats = GenerationStats()
    for prompt in FIT_PROMPTS + PROMPTS:
        out = []
        for ev in dec.stream(prompt, GenerationParams(max_tokens=40, block_size=8)):
            stats.add(ev)
            out.extend(ev.tokens)
        assert out == tiny.greedy_reference(model, prompt, 40), prompt
    assert stats.accepted > 0, "the distilled drafter should get some drafts accepted"


def test_sliding_only_drafter_long_prompt():
    """All-sliding drafter: prefill keeps only window-1 feature rows; still lossless."""
    model = tiny.make_target("qwen3")
    drafter = tiny.make_drafter(2, layer_types=["sliding_attention"] * 2, sliding_window=6)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    prompt = list(range(1, 40))
    assert dec.generate(
        prompt, GenerationParams(max_tokens=30, block_size=6)
    ) == tiny.greedy_reference(model, prompt, 30)


def test_stops_on_eos_and_max_tokens():
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    prompt = PROMPTS[0]
    ref = tiny.greedy_reference(model, prompt, 30)
    eos = ref[7]
    first = ref.index(eos)
    events = list(
        dec.stream(
            prompt, GenerationParams(max_tokens=30, block_size=5, stop_token_ids=frozenset({eos}))
        )
    )
    out = [t for ev in events for t in ev.tokens]
    assert out == ref[: first + 1] and events[-1].finish_reason == "stop"
    events = list(dec.stream(prompt, GenerationParams(max_tokens=11, block_size=16)))
    assert [t for ev in events for t in ev.tokens] == ref[:11]
    assert events[-1].finish_reason == "length"
    assert events[0].prefill and len(events[0].tokens) == 1


def test_mask_token_is_emitted():
    """A committed token equal to the mask id is still emitted."""
    model = tiny.make_target("llama")
    ref = tiny.greedy_reference(model, PROMPTS[0], 20)
    drafter = tiny.make_drafter(1, mask_token_id=ref[3])
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    assert dec.generate(PROMPTS[0], GenerationParams(max_tokens=20, block_size=4)) == ref


def test_two_engines_alternate_in_one_process():
    """Different targets, alternating rounds: neither sees the other's captures."""
    llama, qwen = tiny.make_target("llama", seed=3), tiny.make_target("qwen3_5", seed=4)
    d1, d2 = tiny.make_drafter(1, seed=5), tiny.make_drafter(2, seed=6)
    e1 = SpeculativeDecoder(TargetAdapter(llama, d1.config.target_layer_ids), d1)
    e2 = SpeculativeDecoder(TargetAdapter(qwen, d2.config.target_layer_ids), d2)
    p = GenerationParams(max_tokens=24, block_size=4)
    s1, s2 = e1.stream(PROMPTS[0], p), e2.stream(PROMPTS[1], p)
    out1, out2 = [], []
    for ev1, ev2 in zip(s1, s2):
        out1 += ev1.tokens
        out2 += ev2.tokens
    out1 += [t for ev in s1 for t in ev.tokens]
    out2 += [t for ev in s2 for t in ev.tokens]
    assert out1 == tiny.greedy_reference(llama, PROMPTS[0], 24)
    assert out2 == tiny.greedy_reference(qwen, PROMPTS[1], 24)
    # The targets' layer lists are restored after every call.
    assert all(type(layer).__name__ != "_Proxy" for layer in llama.model.layers)
    assert all(type(layer).__name__ != "_Proxy" for layer in qwen.language_model.model.layers)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_session_reuse_across_turns(family):
    """A second turn extending the first reuses the cache and stays exact."""
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(2)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    session = dec.new_session()
    params = GenerationParams(max_tokens=12, block_size=4)
    turn1 = PROMPTS[0]
    out1 = dec.generate(turn1, params, session)
    turn2 = turn1 + out1 + [40, 41, 42]
    events = list(dec.stream(turn2, params, session))
    assert events[0].reused_tokens == len(turn1) + len(out1) - 1
    out2 = [t for ev in events for t in ev.tokens]
    assert out2 == tiny.greedy_reference(model, turn2, 12)
    # An edited history (diverging early) falls back correctly too.
    turn3 = turn1[:2] + [50, 51]
    assert dec.generate(turn3, params, session) == tiny.greedy_reference(model, turn3, 12)


def test_session_survives_an_interrupted_round():
    """Abandoning a stream mid-round (hard Ctrl-C) leaves the session usable and exact."""
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    session = dec.new_session()
    real_verify = dec._verify
    calls = []

    def verify_then_interrupt(*args):
        out = real_verify(*args)  # the target cache has grown by the whole block
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return out

    dec._verify = verify_then_interrupt  # this instance only
    with pytest.raises(KeyboardInterrupt):
        dec.generate(PROMPTS[0], GenerationParams(max_tokens=30, block_size=4), session)
    dec._verify = real_verify
    prompt = PROMPTS[0] + [7, 8]
    assert dec.generate(prompt, GenerationParams(max_tokens=10), session) == tiny.greedy_reference(
        model, prompt, 10
    )


@pytest.mark.parametrize(
    "family, fallback",
    [("falcon_h1", "layer 0 uses CacheList"), ("gemma2", "5-D grouped attention scores")],
)
def test_other_families_are_exact_alone_and_one_at_a_time_in_a_batch(family, fallback):
    """Falcon-H1's caches are CacheLists (attention + Mamba2, restored from a snapshot after
    a verify: its nested list must be copied, or the restore is the state after the verify);
    gemma2's 5-D attention scores do not take a per-row batch mask: both run a batch one
    request at a time, exactly."""
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(2)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    refs = [tiny.greedy_reference(model, p, 24) for p in PROMPTS]
    for prompt, ref in zip(PROMPTS, refs):
        for block in (2, 4, 8):
            out = dec.generate(prompt, GenerationParams(max_tokens=24, block_size=block))
            assert out == ref, (family, block, prompt)
    batch = BatchDecoder(dec, max_batch=4)
    assert fallback in batch.fallback
    assert batch.generate([(p, GenerationParams(max_tokens=24)) for p in PROMPTS]) == refs


def test_a_target_without_a_decoder_is_refused_by_its_family():
    with pytest.raises(CompatibilityError, match="target family 'mamba' is not supported"):
        TargetAdapter(tiny.make_target("mamba"), (0, 1))
