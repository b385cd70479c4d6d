"""The response datastore: the index (against a brute-force reference), the builder and its
file, the flag's resolution, and the engine with it (still exactly the target)."""

import json
from collections import Counter

import numpy as np
import pytest
import tiny

from dflash2_mlx import GenerationParams, GenerationStats, ParameterError, SpeculativeDecoder
from dflash2_mlx.engine.datastore import MAX_CANDIDATES, MAX_MATCH, Datastore, find_datastore
from dflash2_mlx.errors import ConfigError
from dflash2_mlx.settings import EngineFlags
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.train.datastore import build

SEP = 65535


def stream_of(responses, sep=SEP, dtype=np.uint16):
    return np.array([t for r in responses for t in (*r, sep)], dtype=dtype)


def reference(responses, context, length, n):
    """Brute force: the longest context suffix (n .. MAX_MATCH tokens) occurring in a response
    with a token after it; then, token by token, the most frequent next token among the
    occurrences still agreeing (ties: the smallest id). Also the first token's vote share and
    whether each token is sure (two occurrences or more reach it, all agreeing)."""
    best, occ = 0, []
    for k in range(n, min(MAX_MATCH, len(context)) + 1):
        suffix = context[-k:]
        found = [(r, i + k) for r in responses for i in range(len(r) - k) if r[i : i + k] == suffix]
        if not found:
            break
        best, occ = k, found
    if not best:
        return None
    out, share, sure = [], 0.0, []
    for _ in range(length):
        nxt = Counter(r[j] for r, j in occ if j < len(r))
        if not nxt:
            break
        top = max(nxt.values())
        tok = min(t for t, c in nxt.items() if c == top)
        share = share if out else top / sum(nxt.values())
        out.append(tok)
        sure.append(len(nxt) == 1 and top >= 2)
        occ = [(r, j + 1) for r, j in occ if j < len(r) and r[j] == tok]
    return (out, best, share, tuple(sure)) if out else None


def test_a_frequent_key_votes_over_its_first_occurrences_in_the_file():
    """Past MAX_CANDIDATES occurrences only the first ones in file order vote (the index sorts
    without stability, so the lookup restores the order): 7 wins among the first ones, 8
    overall."""
    first = MAX_CANDIDATES // 2 + 1
    responses = [[1, 2, 3, 4, 7]] * first + [[1, 2, 3, 4, 8]] * (MAX_CANDIDATES - first)
    responses += [[1, 2, 3, 4, 8]] * MAX_CANDIDATES
    store = Datastore(stream_of(responses), SEP, min_match=4)
    assert store.match([1, 2, 3, 4], 1).tokens == [7]
    assert reference(responses, [1, 2, 3, 4], 1, 4)[0] == [8]  # what an uncapped vote picks


def test_longest_match_wins_then_the_most_frequent_continuation():
    responses = [
        [1, 2, 3, 4, 5, 6, 7],
        [9, 2, 3, 4, 5, 8, 8],
        [9, 2, 3, 4, 5, 8, 9],
        [0, 1, 2, 3, 4],  # "1 2 3 4" at its end: nothing follows, not indexed
    ]
    store = Datastore(stream_of(responses), SEP, min_match=4)
    m = store.match([1, 2, 3, 4, 5], 5)
    assert (m.tokens, m.matched, m.support) == ([6, 7], 5, 1)  # stops at its response's end
    m = store.match([7, 2, 3, 4, 5], 5)  # "2 3 4 5" three times: 8 twice, 6 once
    assert (m.tokens, m.matched, m.support) == ([8, 8], 4, 3)
    m = store.match([9, 2, 3, 4, 5], 5)
    assert (m.tokens, m.matched) == ([8, 8], 5)  # the tie after "8" takes the smaller id
    assert m.sure == (True, False)  # both occurrences go on with 8, then split 8 / 9
    assert store.match([1, 2, 3, 4, 5], 5).sure == (False, False)  # one occurrence: never
    assert store.match([4, 5, 6], 3) is None  # shorter than min_match
    assert store.propose([6, 2, 3, 9], 3) == [] and store.propose([1, 2, 3, 4, 5], 0) == []
    assert store.propose([1, 2, 3, 4], 3) == [5, 6, 7]  # the end of [0, 1, 2, 3, 4] is not a match
    assert store.propose([70000, 2, 3, 4], 3) == []  # an id beyond the file's range


@pytest.mark.parametrize("vocab,dtype,sep", [(7, np.uint16, SEP), (7, np.uint32, 2**32 - 1)])
def test_matches_a_brute_force_reference(vocab, dtype, sep):
    """Random responses over a small alphabet (many repeats); uint32 ids take the hashed
    key path (4 ids do not fit 64 bits), which confirms candidates by their tokens."""
    rng = np.random.default_rng(vocab)
    responses = [rng.integers(0, vocab, size=rng.integers(3, 40)).tolist() for _ in range(60)]
    store = Datastore(stream_of(responses, sep, dtype), sep, min_match=3)
    for _ in range(300):
        context = rng.integers(0, vocab, size=rng.integers(1, 24)).tolist()
        found = store.match(context, 6)
        ref = reference(responses, context, 6, 3)
        assert (found.tokens, found.matched, found.share, found.sure) == ref if ref else not found
        proposed = store.propose(context, 6)
        assert proposed == (ref[0] if ref and ref[2] >= store.min_share else []), context


def test_bad_min_match_and_decoder_argument_are_refused():
    with pytest.raises(ValueError, match="min_match"):
        Datastore(stream_of([[1, 2]]), SEP, min_match=0)
    for bad in (-0.1, 1.5, True, "0.8", float("nan")):
        with pytest.raises(ValueError, match="min_share must be a number in"):
            Datastore(stream_of([[1, 2]]), SEP, min_share=bad)
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2)
    with pytest.raises(ParameterError, match="datastore must be a Datastore"):
        SpeculativeDecoder(
            TargetAdapter(model, drafter.config.target_layer_ids), drafter, datastore="yes"
        )


def _jsonl(path, responses):
    path.write_text(
        "".join(json.dumps({"prompt_ids": [1], "response_ids": r}) + "\n" for r in responses)
    )
    return path


def test_the_builder_writes_a_compact_file_that_names_its_sources(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [[5, 6, 7, 8, 9], [5, 6, 7, 8, 1]])
    b = _jsonl(tmp_path / "b.jsonl", [[40000, 6, 7, 8, 9, 2]])
    out = tmp_path / "datastore.npz"
    meta = build([a, b], out, note="test")
    assert [s["file"] for s in meta["sources"]] == ["a.jsonl", "b.jsonl"]
    assert (meta["responses"], meta["tokens"], meta["dtype"]) == (3, 16, "uint16")
    store = Datastore.load(out)
    assert store.meta == meta and len(store) == 19 and find_datastore(tmp_path) == out
    assert Datastore.load(out, min_match=4).propose([3, 6, 7, 8], 3) == []  # nowhere
    m = store.match([3, 6, 7, 8], 3)  # "6 7 8": 9 twice, 1 once; then b's 2
    assert (m.tokens, m.matched, m.support, m.share) == ([9, 2], 3, 3, 2 / 3)
    assert store.propose([3, 6, 7, 8], 3) == []  # 2 of 3 agree: below the default 0.8
    assert Datastore.load(out, min_share=0.6).propose([3, 6, 7, 8], 3) == [9, 2]
    assert find_datastore(tmp_path / "a") is None and find_datastore(None) is None


def test_bad_inputs_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"response_ids": [1, 2]}\n{"prompt_ids": [3]}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: no response_ids"):
        build([bad], tmp_path / "x.npz")
    bad.write_text('{"response_ids": []}\n\n')
    with pytest.raises(ConfigError, match=r"no response tokens in .*bad.jsonl"):
        build([bad], tmp_path / "x.npz")  # it would build a store that cannot load
    bad.write_text('{"response_ids": [1, -2]}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: response_ids must be a list of ids"):
        build([bad], tmp_path / "x.npz")
    junk = tmp_path / "datastore.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="datastore.npz: cannot read it as a datastore"):
        Datastore.load(junk)
    np.savez(junk, tokens=np.zeros((2, 2), np.uint16), separator=np.int64(SEP))
    with pytest.raises(ConfigError, match="must be a non-empty 1-D unsigned array"):
        Datastore.load(junk)
    np.savez(junk, tokens=np.zeros(0, np.uint16), separator=np.int64(SEP))
    with pytest.raises(ConfigError, match="must be a non-empty 1-D unsigned array"):
        Datastore.load(junk)
    np.savez(junk, tokens=np.arange(4, dtype=np.uint16), separator=np.arange(3))
    with pytest.raises(ConfigError, match="datastore.npz: cannot read it as a datastore"):
        Datastore.load(junk)
    whole = junk.read_bytes()
    for damaged in (whole[: len(whole) // 2], b""):  # truncated, empty: no zip / EOF errors
        junk.write_bytes(damaged)
        with pytest.raises(ConfigError, match="datastore.npz: cannot read it as a datastore"):
            Datastore.load(junk)


# ------------------------------------------------------------------------------ the engine
PROMPTS = [[5, 6, 7, 8, 9, 5, 6], [3, 14, 15, 9, 26, 3], [2, 7, 1, 8, 2, 8, 1, 8, 2]]


def _store_of_answers(model, diverge_at=()):
    """A datastore of the target's own greedy answers to PROMPTS (so it fires and is often
    right), plus, for each position in `diverge_at`, two copies that leave the answer there
    (they outvote it until the contexts differ: proposals that are right, then wrong)."""
    answers = [tiny.greedy_reference(model, p, 40) for p in PROMPTS]
    noisy = [a[:k] + [(t + 1) % tiny.VOCAB for t in a[k:]] for a in answers for k in diverge_at]
    return Datastore(stream_of(answers + noisy + noisy), SEP), answers


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("lookup", [0, 2])
def test_greedy_with_the_datastore_equals_plain_decoding(family, lookup):
    """Datastore rounds (accepted and rejected), lookup rounds and drafter rounds mix; every
    output is exactly plain greedy decoding, and the stats count the datastore's rounds."""
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(2, block_size=8)
    store, answers = _store_of_answers(model, diverge_at=(9, 22))
    adapter = TargetAdapter(model, drafter.config.target_layer_ids)
    on = SpeculativeDecoder(adapter, drafter, lookup=lookup, datastore=store)
    off = SpeculativeDecoder(adapter, drafter, lookup=lookup)
    stats = GenerationStats()
    for prompt, ref in zip(PROMPTS, answers):
        for block in (2, 8):
            params = GenerationParams(max_tokens=40, block_size=block)
            events = list(on.stream(prompt, params))
            for ev in events:
                stats.add(ev)
            assert [t for ev in events for t in ev.tokens] == ref, (family, prompt, block)
            assert off.generate(prompt, params) == ref
            assert all(ev.block_size <= 8 for ev in events[1:] if ev.source == "datastore")
    assert stats.datastore_rounds > 0 and stats.datastore_accepted > 0
    assert stats.datastore_accepted < stats.datastore_drafted  # some proposals were wrong
    d = stats.as_dict()
    assert d["datastore_tau"] == round(
        (stats.datastore_accepted + stats.datastore_rounds) / stats.datastore_rounds, 4
    )


def test_the_datastore_comes_after_context_lookup():
    """A context that repeats itself: lookup proposes first; the datastore only where lookup
    finds nothing."""
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2, block_size=4)
    store, _ = _store_of_answers(model)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=1, datastore=store
    )
    prompt = PROMPTS[0]
    session = dec.new_session()
    for ev in dec.stream(prompt, GenerationParams(max_tokens=30), session):
        if not ev.prefill and ev.source == "datastore":
            break
    else:  # its store holds this model's own answers: it must fire
        pytest.fail("the datastore never proposed in 30 tokens of one of its own answers")
    # Where it fired, lookup (min_match 1) had nothing: the last token never occurred before.
    history = session.tokens[: -len(ev.tokens)]
    assert history[-1] not in history[:-1]


def test_the_flag_turns_it_off_and_the_settings_say_so(tmp_path):
    import dflash2_mlx as d2
    from dflash2_mlx.registry import ResolvedPair
    from dflash2_mlx.settings import resolve_engine

    assert EngineFlags().datastore is True
    with pytest.raises(ParameterError, match="datastore must be True or False"):
        EngineFlags(datastore=None)
    model, drafter = tiny.make_target("llama"), tiny.make_drafter(2, block_size=8)
    store, _ = _store_of_answers(model)
    plain = ResolvedPair("org/target", "org/drafter")
    for given, on in ((store, True), (None, False)):
        pair = d2.Pair.from_models(model, None, drafter, lookup=2, datastore=given)
        assert resolve_engine(EngineFlags(), pair, plain, None).datastore is on


def test_load_pair_takes_the_drafters_datastore_as_asked(tmp_path):
    import dflash2_mlx as d2
    from tiny_pair import save_pair

    target, drafter = save_pair(tmp_path)
    assert d2.load_pair(target, drafter).decoder.datastore is None  # none shipped: off
    with pytest.raises(ConfigError, match="ships no datastore.npz"):
        d2.load_pair(target, drafter, datastore=True)
    build([_jsonl(tmp_path / "r.jsonl", [[20, 21, 22, 23, 24]])], drafter / "datastore.npz")
    assert len(d2.load_pair(target, drafter).decoder.datastore) == 6
    assert d2.load_pair(target, drafter, datastore=True).decoder.datastore is not None
    assert d2.load_pair(target, drafter, datastore=False).decoder.datastore is None


@pytest.mark.real_model
@pytest.mark.slow
def test_the_shipped_datastore_is_lossless_on_the_embedded_pair(tmp_path_factory):
    """The SmolLM2 drafter's datastore: small, names its sources (never the held-out file),
    fires on a held-out prompt, and the answer is exactly plain greedy decoding."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from smollm2 import any_conversion

    from dflash2_mlx import Pair, load_drafter
    from dflash2_mlx.prompts import load_prompts
    from dflash2_mlx.registry import EMBEDDED_DRAFTER
    from dflash2_mlx.text import chat_prompt_ids

    path = find_datastore(EMBEDDED_DRAFTER)
    assert path is not None and path.stat().st_size < 4 * 2**20  # next to a 31 MB drafter
    store = Datastore.load(path)
    files = [s["file"] for s in store.meta["sources"]]
    assert "regen_train.jsonl" in files and not any("heldout" in f for f in files)
    model, tokenizer = load(str(any_conversion(tmp_path_factory)))
    pair = Pair.from_models(
        model, tokenizer, load_drafter(EMBEDDED_DRAFTER, dtype=mx.float32), datastore=store
    )
    prompt = next(p for p in load_prompts("heldout") if p.id == "instructions-005")
    ids = chat_prompt_ids(tokenizer, prompt.messages)
    events = list(pair.stream(ids, GenerationParams(max_tokens=48, block_size=8)))
    plain = []
    for tok, _ in generate_step(
        mx.array(ids), model, max_tokens=48, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        plain.append(int(tok))
        if int(tok) in pair.eos_ids:
            break
    assert [t for ev in events for t in ev.tokens] == plain
    assert any(ev.source == "datastore" and ev.accepted > 0 for ev in events)


@pytest.mark.slow
def test_sampling_with_the_datastore_follows_the_target():
    """Datastore proposals are point masses like lookup's: accepted with probability p(x),
    else a draw from the residual. A datastore that fires after any first token (the prompt's
    last 3 tokens + it, then two arbitrary ones): the three tokens' marginals are exact."""
    from test_sampling import V, empirical, exact_marginals, tv

    from dflash2_mlx import SamplingParams

    prompt = [1, 5, 3, 7, 2, 9]
    model = tiny.make_target("llama", vocab=V, seed=11)
    drafter = tiny.make_drafter(2, vocab=V, mask_token_id=V - 1, seed=12, top_k=4)
    responses = [prompt[-3:] + [t, (t * 5 + 1) % V, (t * 3 + 2) % V] for t in range(V)]
    store = Datastore(stream_of(responses), SEP)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, datastore=store
    )
    sp = SamplingParams(temperature=1.0)
    stats = GenerationStats()
    for seed in range(10):
        sampled = SamplingParams(1.0, seed=seed)
        params = GenerationParams(max_tokens=3, block_size=3, sampling=sampled)
        for ev in dec.stream(prompt, params):
            stats.add(ev)
    assert stats.datastore_rounds == 10  # the first round of every generation
    emp = empirical(dec, sp, 1200, prompt)
    exact = exact_marginals(model, sp, prompt)
    for i in range(3):
        assert tv(emp[i], exact[i]) < 0.085, (i, tv(emp[i], exact[i]))


def test_a_datastore_of_another_vocabulary_is_refused():
    """Ids past the target's vocabulary (a store built for another tokenizer) would be
    drafted and crash the verify: refused when the decoder is built, naming the id."""
    from dflash2_mlx.errors import CompatibilityError

    model, drafter = tiny.make_target("llama"), tiny.make_drafter(2, block_size=4)
    adapter = TargetAdapter(model, drafter.config.target_layer_ids)
    sep = tiny.VOCAB + 10
    fits = Datastore(np.array([1, 2, 3, 4, sep, 5, 6], dtype=np.uint32), sep, min_match=2)
    SpeculativeDecoder(adapter, drafter, datastore=fits)  # the separator itself is no token
    past = Datastore(np.array([1, 2, tiny.VOCAB + 3, 4, sep], dtype=np.uint32), sep, min_match=2)
    with pytest.raises(CompatibilityError, match=rf"token id {tiny.VOCAB + 3}, outside"):
        SpeculativeDecoder(adapter, drafter, datastore=past)
