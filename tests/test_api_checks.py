"""The library refuses what it cannot honour, before anything runs: another pair's session,
arguments of the wrong type, settings `load_pair` would only reject after loading; a drafter
shared by two pairs drafts for each with its own target; a round cut by a stop counts the
tokens it committed."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import tiny

from dflash2_mlx import GenerationParams, ParameterError, SamplingParams
from dflash2_mlx.api import Pair
from dflash2_mlx.engine.batch import BatchDecoder

PROMPT = [3, 14, 15, 9, 26]


def make_pair(layers: int = 4, seed: int = 0, drafter=None) -> Pair:
    drafter = drafter if drafter is not None else tiny.make_drafter(2)
    return Pair.from_models(tiny.make_target("llama", seed=seed, layers=layers), None, drafter)


@pytest.fixture(scope="module")
def pairs():
    return make_pair(4, seed=0), make_pair(6, seed=1)


def test_another_pairs_session_is_refused(pairs):
    """Its caches fit the other pair's models: the output would be silently wrong."""
    a, b = pairs
    params = GenerationParams(max_tokens=4, block_size=4)
    session = a.new_session()
    a.generate(PROMPT, params, session)
    with pytest.raises(ParameterError, match="belongs to another pair"):
        b.generate(PROMPT + [1, 2], params, session)
    with pytest.raises(ParameterError, match="belongs to another pair"):
        BatchDecoder(b.decoder).add(PROMPT, b.with_defaults(params), session)
    with pytest.raises(ParameterError, match="session must be a Session"):
        b.generate(PROMPT, params, "abc")
    # its own pair goes on with it, exactly
    out, _ = a.generate(PROMPT + [1, 2], params, session)
    assert out == tiny.greedy_reference(a.model, PROMPT + [1, 2], 4)


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda p: p.generate(PROMPT, None), "params must be a GenerationParams"),
        (lambda p: p.generate(PROMPT, SamplingParams()), "params must be a GenerationParams"),
        (
            lambda p: GenerationParams(constraint={"type": "object"}),
            "constraint must be a callable",
        ),
        (
            lambda p: list(p.stream(PROMPT, GenerationParams(), cancel=5)),
            "cancel must be a callable",
        ),
        (lambda p: p.batch(width_cost=5), "width_cost must be a callable"),
        (
            lambda p: Pair.from_models(p.model, None, p.drafter, prefill_chunk=0),
            "prefill_chunk must be an int >= 1",
        ),
    ],
)
def test_arguments_of_the_wrong_kind_are_a_parameter_error(pairs, call, needle):
    with pytest.raises(ParameterError, match=needle):
        call(pairs[0])


def test_generate_batch_takes_any_sequence(pairs):
    a = pairs[0]
    params = GenerationParams(max_tokens=3, block_size=4)
    results = a.generate_batch((p for p in (PROMPT, PROMPT[:3])), params)
    assert [out for out, _ in results] == [
        tiny.greedy_reference(a.model, p, 3) for p in (PROMPT, PROMPT[:3])
    ]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"lookup": -1}, "lookup must be an int >= 0"),
        ({"datastore": "yes"}, "datastore must be True, False or None"),
        ({"draft_vocab_limit": "x"}, "draft_vocab_limit must be an int or None"),
    ],
)
def test_load_pair_refuses_bad_settings_before_loading(monkeypatch, kwargs, needle):
    from dflash2_mlx import loader

    monkeypatch.setattr(loader, "fetch", lambda *a, **k: pytest.fail("fetched a model"))
    with pytest.raises(ParameterError, match=needle):
        loader.load_pair("/nowhere/target", "/nowhere/drafter", **kwargs)


@pytest.mark.parametrize("eos", [2, [2, 7], {2}])
def test_eos_ids_from_any_tokenizer(eos):
    pair = Pair(None, SimpleNamespace(eos_token_id=eos), None, None)
    assert pair.eos_ids == frozenset([2] if eos == 2 else eos)
    assert Pair(None, SimpleNamespace(), None, None).eos_ids == frozenset()


def test_one_drafter_in_two_pairs_drafts_for_each_with_its_target():
    drafter = tiny.make_drafter(2)
    a, b = make_pair(4, seed=0, drafter=drafter), make_pair(4, seed=3, drafter=drafter)
    params = GenerationParams(max_tokens=12, block_size=4)
    alone = make_pair(4, seed=0, drafter=tiny.make_drafter(2))
    want = alone.generate(PROMPT, params)
    b.generate(PROMPT, params)  # binds the shared drafter to b's target
    out, stats = a.generate(PROMPT, params)
    assert drafter.is_bound(a.decoder.binding)
    assert out == want[0] and stats.accepted == want[1].accepted


def test_a_round_cut_short_counts_what_it_committed(pairs):
    """max_tokens (or a stop) inside an accepted run: the histogram and τ count the round's
    committed tokens, not the drafts after the cut."""
    a = pairs[0]
    ref = tiny.greedy_reference(a.model, PROMPT, 12)
    params = GenerationParams(max_tokens=6, block_size=4, prediction=tuple(ref), lookup_block=8)
    out, stats = a.generate(PROMPT, params)
    assert out == ref[:6]
    counted = sum(k * n for k, n in Counter(stats.histogram).items())
    assert counted + 1 == stats.committed == 6  # + the prefill's first token


def test_the_readme_streaming_example(tiny_pair):
    """d2.stream_text: the rounds' text adds up to the whole reply, stop tokens not text."""
    import dflash2_mlx as d2

    pair = d2.load_pair(*tiny_pair)
    ids = pair.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    params = d2.GenerationParams(max_tokens=24, block_size=4)
    chunks = list(d2.stream_text(pair, ids, params))
    whole = d2.generate_text(pair, ids, params)
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.event.tokens] == whole.tokens
    assert chunks[-1].finish_reason in ("stop", "length")


def test_the_prefill_chunk_is_the_devices_unless_given(pairs):
    """256 prompt tokens a chunk on the CPU (faster there than 512, and a cancel between
    chunks comes sooner), 512 on a GPU; a given one is kept."""
    import mlx.core as mx

    p, _ = pairs
    assert p.decoder.prefill_chunk == (256 if mx.default_device() == mx.cpu else 512)
    given = Pair.from_models(p.model, p.tokenizer, p.drafter, prefill_chunk=64)
    assert given.decoder.prefill_chunk == 64
