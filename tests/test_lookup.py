"""Context lookup drafts: the index, and the engine with them (still exactly the target)."""

import numpy as np
import pytest
import tiny
from test_sampling import V as SAMPLING_V
from test_sampling import empirical, exact_marginals, tv

from dflash2_mlx import GenerationParams, GenerationStats, ParameterError, SamplingParams
from dflash2_mlx import SpeculativeDecoder
from dflash2_mlx.engine.lookup import SHORT_DRAFTS, SURE_AGREEMENT, LOOK_BACK, RECENT, ContextLookup
from dflash2_mlx.target.adapter import TargetAdapter

# Repeats in the prompt, and tiny random targets loop: lookup has something to find.
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    [3, 14, 15, 9, 26, 3, 14, 15],
    [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3, 6, 0, 2, 8, 7],
]


def test_proposes_what_followed_the_latest_earlier_occurrence():
    lk = ContextLookup(2)
    lk.reset([1, 2, 3, 4, 1, 2, 5, 6, 1, 2])
    assert lk.propose(3) == [5, 6, 1]  # the latest earlier "1 2" is at 4, not 0
    assert lk.propose(1) == [5]
    assert lk.propose(0) == []
    lk.extend([7])
    assert lk.propose(4) == []  # "2 7" never occurred before
    lk.extend([9, 9, 9])
    assert lk.propose(3) == [9]  # "9 9" at 11: followed by one token so far
    assert ContextLookup(3).propose(2) == []  # nothing committed yet


def test_the_occurrence_with_the_longest_agreeing_context_wins():
    lk = ContextLookup(2)
    lk.reset([7, 1, 2, 3, 8, 1, 2, 4, 9, 7, 1, 2])
    assert lk.propose(3) == [3, 8, 1]  # "7 1 2" at 0 agrees further than "8 1 2" at 4
    lk.reset([5, 1, 2, 3, 6, 1, 2, 4, 9, 7, 1, 2])
    assert lk.propose(3) == [4, 9, 7]  # neither agrees before "1 2": the latest
    # Agreement is compared LOOK_BACK tokens back at most: then the latest of the tied wins.
    long = list(range(10, 10 + LOOK_BACK + 3))
    lk.reset([*long, 1, 2, 3, 99, *long, 1, 2, 4, 98, *long, 1, 2])
    assert lk.propose(2) == [4, 98]
    # Only the RECENT latest occurrences are compared: an older, better one is not found.
    lk.reset([8, 8, 1, 2, 3] + [5, 1, 2, 4] * RECENT + [8, 8, 1, 2])
    assert lk.propose(1) == [4]
    lk.reset([8, 8, 1, 2, 3] + [5, 1, 2, 4] * (RECENT - 1) + [8, 8, 1, 2])
    assert lk.propose(1) == [3]


def test_a_repeat_agreeing_on_few_tokens_proposes_few_drafts():
    """Fewer than SURE_AGREEMENT agreeing tokens (the key's included): at most SHORT_DRAFTS."""
    lk = ContextLookup(2)
    after = list(range(20, 40))
    lk.reset([9, 1, 2, *after, 8, 1, 2])  # "1 2" agrees; 9 vs 8 before it does not
    assert SURE_AGREEMENT == 3 and lk.find(15) == (after[:SHORT_DRAFTS], 2)
    lk.reset([8, 1, 2, *after, 8, 1, 2])  # 3 agree: trusted
    assert lk.find(15) == (after[:15], 3)
    uncapped = ContextLookup(2, sure=0)
    uncapped.reset([9, 1, 2, *after, 8, 1, 2])
    assert uncapped.find(15) == (after[:15], 2)
    assert ContextLookup(3).find(4) == ([], 0)


def test_extending_equals_indexing_at_once():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, size=200).tolist()
    for n in (1, 2, 3):
        step, whole = ContextLookup(n), ContextLookup(n)
        step.reset(tokens[:7])
        for i in range(7, len(tokens), 3):
            step.extend(tokens[i : i + 3])
            whole.reset(tokens[: i + 3])
            assert step.propose(5) == whole.propose(5)
            assert step._starts == whole._starts


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_min_match_is_refused(bad):
    with pytest.raises(ValueError, match="min_match"):
        ContextLookup(bad)
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2)
    with pytest.raises(ParameterError, match="lookup must be an int >= 0"):
        SpeculativeDecoder(
            TargetAdapter(model, drafter.config.target_layer_ids),
            drafter,
            lookup=-1 if bad == 0 else bad,
        )


# (the tiny qwen3_5 target repeats single tokens, not pairs: lookup 1 is what fires there)
@pytest.mark.parametrize("family,lookup", [("llama", 1), ("llama", 3), ("qwen3_5", 1)])
@pytest.mark.parametrize("version", [1, 2])
def test_greedy_with_lookup_equals_plain_decoding(family, version, lookup):
    """Lookup rounds and drafter rounds mix (the drafter catches up on the features of the
    rounds it skipped); every output is exactly plain greedy decoding."""
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(version, block_size=8)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=lookup
    )
    stats = GenerationStats()
    for prompt in PROMPTS:
        ref = tiny.greedy_reference(model, prompt, 40)
        for block in (2, 5, 8):
            out = []
            for ev in dec.stream(prompt, GenerationParams(max_tokens=40, block_size=block)):
                stats.add(ev)
                out.extend(ev.tokens)
            assert out == ref, (family, version, lookup, block, prompt)
    assert 0 < stats.lookup_rounds < stats.rounds  # both kinds of round happened
    assert stats.accepted > 0


def test_a_session_reindexes_its_context_on_every_prompt():
    """Multi-turn on one session: the second prompt shares a prefix with the first; the index
    follows the rolled-back context, so the output is still exactly greedy."""
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2, block_size=8)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=2
    )
    session = dec.new_session()
    first = PROMPTS[0]
    out1 = dec.generate(first, GenerationParams(max_tokens=20), session)
    second = first + out1[:5] + [30, 31, 5, 6]
    out2 = dec.generate(second, GenerationParams(max_tokens=20), session)
    assert out2 == tiny.greedy_reference(model, second, 20)
    assert session.lookup.tokens == session.tokens


@pytest.mark.slow
def test_sampling_with_lookup_follows_the_target():
    """Lookup proposals are point masses: accepted with probability p(x), else a draw from the
    residual. The first three tokens' marginals match the exact ones."""
    prompt = [1, 5, 3, 7, 2, 9, 4, 0, 6, 8, 10, 1, 5, 3]  # every token has a successor to propose
    model = tiny.make_target("llama", vocab=SAMPLING_V, seed=11)
    drafter = tiny.make_drafter(2, vocab=SAMPLING_V, mask_token_id=SAMPLING_V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=1
    )
    sp = SamplingParams(temperature=1.0)
    stats = GenerationStats()
    for seed in range(20):
        for ev in dec.stream(
            prompt,
            GenerationParams(max_tokens=3, block_size=3, sampling=SamplingParams(1.0, seed=seed)),
        ):
            stats.add(ev)
    assert stats.lookup_rounds >= 10  # in at least half of the generations
    emp = empirical(dec, sp, 1200, prompt)
    exact = exact_marginals(model, sp, prompt)
    for i in range(3):
        assert tv(emp[i], exact[i]) < 0.085, (i, tv(emp[i], exact[i]))


def test_the_cli_default_is_the_librarys():
    """The CLI resolves --lookup through the library (one DEFAULT_LOOKUP); its help says it."""
    import typer

    from dflash2_cli.app import app
    from dflash2_cli.common import engine_flags

    from dflash2_mlx.engine.lookup import DEFAULT_LOOKUP

    CLI_DEFAULT = engine_flags().lookup_or_default
    assert CLI_DEFAULT == DEFAULT_LOOKUP == 3
    for name, command in typer.main.get_command(app).commands.items():
        for option in command.params:
            if "--lookup" in option.opts:
                assert f"[default: {DEFAULT_LOOKUP}]" in option.help, name


def cycling_target(period: int = 12):
    """A real llama whose greedy continuation cycles through blocks of `period` ids (t -> t + 1
    within each block): its LM head rows are the embeddings of each id's predecessor, and its
    layers are damped (not removed: attention and the caches still shape every logit).
    Its answers repeat themselves, so context lookup proposes long and right."""
    import mlx.core as mx

    model = tiny.make_target("llama", tie_word_embeddings=False)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * 0.1
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * 0.1
    pred = [period * (t // period) + (t % period - 1) % period for t in range(tiny.VOCAB)]
    model.lm_head.weight = model.model.embed_tokens.weight[mx.array(pred)] * 3
    return model


@pytest.mark.parametrize("version", [1, 2])
def test_lookup_rounds_run_past_the_drafter_block_and_stay_exact(version):
    """A repeating answer: lookup rounds verify up to lookup_block tokens (past the drafter's
    block 4) and commit them; drafter rounds keep the block; the last round is cut to
    max_tokens; the output is exactly plain greedy decoding, at any lookup_block."""
    model = cycling_target()
    drafter = tiny.make_drafter(version, block_size=8)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=2
    )
    prompt = [30, 31, 7, 50]
    ref = tiny.greedy_reference(model, prompt, 57)
    assert ref[:14] == [51, 52, 53, 54, 55, 56, 57, 58, 59, 48, 49, 50, 51, 52]  # it cycles
    rounds = {}
    for lookup_block in (4, 16, None):
        params = GenerationParams(max_tokens=57, block_size=4, lookup_block=lookup_block)
        events = list(dec.stream(prompt, params))
        assert [t for ev in events for t in ev.tokens] == ref, lookup_block
        cap = lookup_block or 16
        looked = [ev for ev in events[1:] if ev.source == "lookup"]
        assert looked and all(ev.block_size <= cap for ev in looked)
        assert all(ev.block_size <= 4 for ev in events[1:] if ev.source == "drafter")
        rounds[lookup_block] = len(events) - 1
        if cap > 4:  # the 12-token cycle is proposed whole (12 drafts) and accepted
            assert max(ev.accepted for ev in looked) == 12
            assert events[-1].finish_reason == "length" and events[-1].block_size <= 57 - sum(
                len(ev.tokens) for ev in events[:-1]
            )
    assert rounds[16] == rounds[None] < rounds[4]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_long_rejected_lookup_proposals_roll_back_exactly(family):
    """Random targets do not follow the repeat: 15-token lookup proposals are mostly
    rejected, so wide verifies are rolled back (KV trim, Gated-DeltaNet replay); still
    exactly plain greedy decoding."""
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(2, block_size=4)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=1
    )
    first = tiny.greedy_reference(model, [5, 6, 7], 30)
    prompt = [5, 6, 7] + first + [5, 6, 7]  # the context repeats itself
    ref = tiny.greedy_reference(model, prompt, 40)
    events = list(dec.stream(prompt, GenerationParams(max_tokens=40, block_size=4)))
    assert [t for ev in events for t in ev.tokens] == ref
    assert any(ev.source == "lookup" and ev.block_size > 4 for ev in events)


def test_lookup_block_is_checked_and_plain_decoding_proposes_nothing():
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ParameterError, match="lookup_block must be an int >= 1"):
            GenerationParams(lookup_block=bad)
    model = cycling_target()
    drafter = tiny.make_drafter(2, block_size=4)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=2
    )
    prompt = [30, 31, 7, 50]
    ref = tiny.greedy_reference(model, prompt, 30)
    plain = list(dec.stream(prompt, GenerationParams(max_tokens=30, speculative=False)))
    assert [t for ev in plain for t in ev.tokens] == ref
    assert all(ev.drafted == 0 and ev.block_size == 1 for ev in plain)
    # Block 1 runs no drafter; lookup rounds still propose (they cost no draft pass).
    only = list(dec.stream(prompt, GenerationParams(max_tokens=30, block_size=1)))
    assert [t for ev in only for t in ev.tokens] == ref
    assert all(ev.drafted == 0 for ev in only if ev.source == "drafter")
    assert any(ev.source == "lookup" and ev.accepted > 1 for ev in only)


def test_round_events_are_keyword_only_and_name_their_source():
    from dflash2_mlx import RoundEvent

    with pytest.raises(TypeError):
        RoundEvent([1], 0, 0, 1)  # positional fields are refused: build events by keyword
    with pytest.raises(ValueError, match="source"):
        RoundEvent(tokens=[1], source="cache")
    stats = GenerationStats()
    stats.add(RoundEvent(tokens=[4], prefill=True, prefill_ms=7.5, prompt_tokens=3))
    stats.add(
        RoundEvent(
            tokens=[1, 2, 3], drafted=12, accepted=2, block_size=13, verify_ms=2.0, source="lookup"
        )
    )
    stats.add(
        RoundEvent(
            tokens=[5],
            drafted=3,
            accepted=0,
            block_size=4,
            draft_ms=1.0,
            verify_ms=1.0,
            source="drafter",
        )
    )
    stats.add(
        RoundEvent(
            tokens=[6, 7], drafted=5, accepted=1, block_size=6, verify_ms=1.0, source="prediction"
        )
    )
    d = stats.as_dict()
    assert d["prefill_ms"] == 7.5 and d["verify_ms"] == 4.0  # prefill is not a verify
    assert (d["lookup_rounds"], d["lookup_drafted"], d["lookup_accepted"]) == (1, 12, 2)
    assert d["lookup_tau"] == 3.0 and d["longest_round"] == 13
    assert (d["prediction_drafted"], d["prediction_accepted"]) == (5, 1)
