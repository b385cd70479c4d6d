"""Context lookup drafts: the index, and the engine with them (still exactly the target)."""

import numpy as np
import pytest
import tiny
from test_sampling import V as SAMPLING_V
from test_sampling import empirical, exact_marginals, tv

from dflash2_mlx import GenerationParams, GenerationStats, ParameterError, SamplingParams
from dflash2_mlx import SpeculativeDecoder
from dflash2_mlx.engine.lookup import ContextLookup
from dflash2_mlx.target.adapter import TargetAdapter

# Repeats in the prompt, and tiny random targets loop: lookup has something to find.
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 14, 15, 9, 26, 3, 14, 15],
           [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3, 6, 0, 2, 8, 7]]


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


def test_extending_equals_indexing_at_once():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, size=200).tolist()
    for n in (1, 2, 3):
        step, whole = ContextLookup(n), ContextLookup(n)
        step.reset(tokens[:7])
        for i in range(7, len(tokens), 3):
            step.extend(tokens[i:i + 3])
            whole.reset(tokens[:i + 3])
            assert step.propose(5) == whole.propose(5)
            assert step._latest == whole._latest


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_min_match_is_refused(bad):
    with pytest.raises(ValueError, match="min_match"):
        ContextLookup(bad)
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2)
    with pytest.raises(ParameterError, match="lookup must be an int >= 0"):
        SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter,
                           lookup=-1 if bad == 0 else bad)


# (the tiny qwen3_5 target repeats single tokens, not pairs: lookup 1 is what fires there)
@pytest.mark.parametrize("family,lookup", [("llama", 1), ("llama", 3), ("qwen3_5", 1)])
@pytest.mark.parametrize("version", [1, 2])
def test_greedy_with_lookup_equals_plain_decoding(family, version, lookup):
    """Lookup rounds and drafter rounds mix (the drafter catches up on the features of the
    rounds it skipped); every output is exactly plain greedy decoding."""
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(version, block_size=8)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter,
                             lookup=lookup)
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
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter,
                             lookup=2)
    session = dec.new_session()
    first = PROMPTS[0]
    out1 = dec.generate(first, GenerationParams(max_tokens=20), session)
    second = first + out1[:5] + [30, 31, 5, 6]
    out2 = dec.generate(second, GenerationParams(max_tokens=20), session)
    assert out2 == tiny.greedy_reference(model, second, 20)
    assert session.lookup.tokens == session.tokens


def test_sampling_with_lookup_follows_the_target():
    """Lookup proposals are point masses: accepted with probability p(x), else a draw from the
    residual. The first three tokens' marginals match the exact ones."""
    prompt = [1, 5, 3, 7, 2, 9, 4, 0, 6, 8, 10, 1, 5, 3]  # every token has a successor to propose
    model = tiny.make_target("llama", vocab=SAMPLING_V, seed=11)
    drafter = tiny.make_drafter(2, vocab=SAMPLING_V, mask_token_id=SAMPLING_V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter,
                             lookup=1)
    sp = SamplingParams(temperature=1.0)
    stats = GenerationStats()
    for seed in range(20):
        for ev in dec.stream(prompt, GenerationParams(max_tokens=3, block_size=3,
                                                      sampling=SamplingParams(1.0, seed=seed))):
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
