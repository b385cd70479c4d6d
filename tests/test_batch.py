"""Batched speculative decoding (engine/batch.py): each request returns what it returns alone.

Token comparisons between the batched and single engines are comparisons of argmaxes (and
seeded draws) computed by different matmul shapes; the tiny targets' weights are sharpened
(tests/tiny.py) so their top logits are far apart relative to float32 rounding, as in
test_lossless.py, which compares the engine to one-token-per-forward decoding the same way.
"""

import mlx.core as mx
import numpy as np
import pytest
import tiny
from test_sampling import PROMPT, exact_marginals, tv
from test_sampling import V as SMALL_V

from dflash2_mlx import GenerationParams, ParameterError, SamplingParams, SpeculativeDecoder
from dflash2_mlx.engine.batch import BatchDecoder
from dflash2_mlx.target import batch as tbatch
from dflash2_mlx.target.adapter import TargetAdapter
from mlx_lm.models.cache import ArraysCache

FIT_PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 8, 9], [20, 21, 22, 23, 24, 25], [40, 3, 41, 3, 42]]
PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7],
    [9, 8, 7],
    list(range(11, 31)),
    [5, 5, 5, 5],
    [60, 2, 61],
    [33, 34],
]
MAX_TOKENS = [30, 17, 25, 40, 12, 22]


def _decoder(family: str, lookup: int = 2) -> SpeculativeDecoder:
    model = tiny.make_target(family)
    drafter = tiny.fit_drafter(model, tiny.make_drafter(2, block_size=8), FIT_PROMPTS, steps=150)
    return SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=lookup
    )


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen3_5"])
def decoder(request):
    return _decoder(request.param)


def _params(dec: SpeculativeDecoder) -> list[GenerationParams]:
    """Mixed limits: one request stops on a token of its own answer, one has a smaller block,
    one a prediction of its answer with an edit (long accepted runs, then a rejection)."""
    out = [GenerationParams(max_tokens=m) for m in MAX_TOKENS]
    alone = dec.generate(PROMPTS[0], out[0])
    out[0] = GenerationParams(max_tokens=30, stop_token_ids=frozenset({alone[9]}))
    out[2] = GenerationParams(max_tokens=25, block_size=4)
    guess = dec.generate(PROMPTS[3], out[3])
    guess[12] = (guess[12] + 1) % tiny.VOCAB
    out[3] = GenerationParams(max_tokens=40, prediction=tuple(guess))
    return out


def test_batched_greedy_equals_each_alone(decoder):
    params = _params(decoder)
    model = decoder.target.model
    alone = [decoder.generate(p, g) for p, g in zip(PROMPTS, params)]
    # the single engine is itself plain greedy decoding
    assert alone[1] == tiny.greedy_reference(model, PROMPTS[1], params[1].max_tokens)
    assert len(alone[0]) <= 10 and alone[0][-1] in params[0].stop_token_ids
    batch = BatchDecoder(decoder, max_batch=4)  # six requests: two join as others leave
    assert batch.fallback is None
    out: list[list[int]] = [[] for _ in PROMPTS]
    sizes, accepted = set(), []
    for i, ev in batch.stream(zip(PROMPTS, params)):
        out[i].extend(ev.tokens)
        sizes.add(ev.batch_size)
        if ev.batch_size > 1 and not ev.prefill:
            accepted.append(ev.accepted)
    assert out == alone
    assert {1, 4} <= sizes or {2, 4} <= sizes, sizes  # it really ran batched, then drained
    assert len(set(accepted)) > 1, accepted  # rows rolled back by different amounts
    assert not batch.busy and batch.cache is None


def test_requests_join_and_leave_mid_batch(decoder, monkeypatch):
    # compact the shared left padding as soon as there is any, to exercise that path too
    monkeypatch.setattr(tbatch, "_COMPACT_AT", 1)
    params = GenerationParams(max_tokens=24)
    alone = {i: decoder.generate(PROMPTS[i], params) for i in (0, 1, 2, 3)}
    batch = BatchDecoder(decoder, max_batch=4)
    out: dict[int, list[int]] = {}
    ids = {batch.add(PROMPTS[0], params): 0, batch.add(PROMPTS[1], params): 1}
    for step in range(12):
        if step == 3:
            ids[batch.add(PROMPTS[2], params)] = 2
        if step == 5:
            ids[batch.add(PROMPTS[3], params)] = 3
        if step == 7:  # a client disconnects mid-generation: it leaves at once
            gone = next(r for r, i in ids.items() if i == 1)
            assert batch.cancel(gone) is True
            assert all(r.rid != gone for r in batch.rows)
            assert batch.cancel(gone) is False  # already gone: nothing to drop
            with pytest.raises(ParameterError, match="cancel takes an id"):
                batch.cancel(str(gone))
        for rid, ev in batch.step():
            out.setdefault(ids[rid], []).extend(ev.tokens)
    while batch.busy:
        for rid, ev in batch.step():
            out.setdefault(ids[rid], []).extend(ev.tokens)
    for i in (0, 2, 3):
        assert out[i] == alone[i], i
    assert out[1] == alone[1][: len(out[1])] and len(out[1]) < len(alone[1])


@pytest.mark.parametrize("leaves", ["joiner", "solo"])
def test_a_row_that_leaves_right_after_another_joined_a_lone_one(decoder, leaves):
    """A lone row runs on its own caches; a request joins (its first token goes out before
    the next round) and one of the two leaves at once (a stop its first token completed, a
    client gone): the other goes on exactly, its caches matched to its row."""
    params = GenerationParams(max_tokens=24)
    alone = {i: decoder.generate(PROMPTS[i], params) for i in (0, 1)}
    batch = BatchDecoder(decoder, max_batch=4)
    solo = batch.add(PROMPTS[0], params)
    out: dict[int, list[int]] = {}
    for _ in range(3):
        for rid, ev in batch.step():
            out.setdefault(rid, []).extend(ev.tokens)
    joiner = batch.add(PROMPTS[1], params)
    events = batch.step()
    assert [(rid, ev.prefill) for rid, ev in events] == [(joiner, True)]
    for rid, ev in events:
        out.setdefault(rid, []).extend(ev.tokens)
    gone = joiner if leaves == "joiner" else solo
    assert batch.cancel(gone) is True
    while batch.busy:
        for rid, ev in batch.step():
            out.setdefault(rid, []).extend(ev.tokens)
    stays, i = (solo, 0) if gone == joiner else (joiner, 1)
    assert out[stays] == alone[i]
    assert out[gone] == alone[1 - i][: len(out[gone])]


def test_requests_that_keep_arriving_never_hold_a_running_one_up(decoder):
    """A joiner's first token goes out before the next round, but a request done at its
    first token (a max_tokens=1 scoring call) holds no round, and joiners arriving every step
    hold one every other step at most: the running stream goes on, exactly."""
    params = GenerationParams(max_tokens=40)
    alone = decoder.generate(PROMPTS[0], params)
    batch = BatchDecoder(decoder, max_batch=64)
    running = batch.add(PROMPTS[0], params)
    got: list[int] = []
    held = {}
    for kind, max_tokens in (("done at once", 1), ("joining", 3)):
        steps_without = 0
        for i in range(12):
            batch.add([5, 6, (i % 20) + 1], GenerationParams(max_tokens=max_tokens))
            events = batch.step()
            mine = [ev for rid, ev in events if rid == running]
            got += [t for ev in mine for t in ev.tokens]
            steps_without += not any(not ev.prefill for ev in mine)
        held[kind] = steps_without
    assert held["done at once"] <= 1, held  # the first step: its own prefill
    assert held["joining"] <= 6, held  # every other step at most
    while batch.busy:
        got += [t for rid, ev in batch.step() if rid == running for t in ev.tokens]
    assert got == alone


def test_fallback_runs_one_at_a_time():
    """A target without exact per-row rollback runs through the single-sequence engine."""
    dec = _decoder("llama")
    params = GenerationParams(max_tokens=15)
    alone = [dec.generate(p, params) for p in PROMPTS[:3]]
    batch = BatchDecoder(dec, max_batch=4)
    batch.fallback = "forced for this test"
    sizes = {ev.batch_size for _, ev in batch.stream((p, params) for p in PROMPTS[:3])}
    assert batch.generate((p, params) for p in PROMPTS[:3]) == alone
    assert sizes == {1}
    one = BatchDecoder(dec, max_batch=1)  # max_batch=1: the single-sequence engine too
    assert not one.batched and one.capacity == 1
    one.add(PROMPTS[0], params)
    one.add(PROMPTS[1], params)
    out: dict = {}
    while one.busy:
        for rid, ev in one.step():
            out.setdefault(rid, []).extend(ev.tokens)
        assert one.cache is None and len(one.rows) <= 1
    assert [out[0], out[1]] == alone[:2]


def test_bad_requests_are_refused_before_running():
    dec = _decoder("llama")
    batch = BatchDecoder(dec)
    with pytest.raises(ParameterError, match="empty"):
        batch.add([], GenerationParams())
    with pytest.raises(ParameterError, match="block_size"):
        batch.add([1, 2], GenerationParams(block_size=99))
    with pytest.raises(ParameterError, match="max_batch"):
        BatchDecoder(dec, max_batch=0)
    assert not batch.busy


def test_batched_sampling_matches_target():
    """Seeded sampled requests batched with others (different prompts and lengths) keep the
    target's marginals, and each equals its seed's run alone."""
    model = tiny.make_target("llama", vocab=SMALL_V, seed=11)
    drafter = tiny.make_drafter(2, vocab=SMALL_V, mask_token_id=SMALL_V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    sp = SamplingParams(temperature=1.0)
    n = 1200
    requests = []
    for seed in range(n):
        params = GenerationParams(
            max_tokens=3, block_size=3, sampling=SamplingParams(1.0, seed=seed)
        )
        requests.append((PROMPT, params))
        if seed % 3 == 0:  # a neighbour with another prompt length and its own limits
            requests.append(
                (
                    [2, 7, 1, 9, 4][: 2 + seed % 4],
                    GenerationParams(
                        max_tokens=2 + seed % 5, sampling=SamplingParams(0.7, top_k=5, seed=seed)
                    ),
                )
            )
    out = BatchDecoder(dec, max_batch=8).generate(requests)
    mine = [o for (p, _), o in zip(requests, out) if p is PROMPT]
    counts = np.zeros((3, SMALL_V))
    for o in mine:
        for i, t in enumerate(o):
            counts[i, t] += 1
    exact = exact_marginals(model, sp)
    for i in range(3):
        assert tv(counts[i] / n, exact[i]) < 0.085, (i, tv(counts[i] / n, exact[i]))
    for k in range(0, 40, 7):
        assert out[k] == dec.generate(*requests[k]), k
    mx.clear_cache()


def test_pair_generate_batch():
    """The library entry point: one params for all or one per prompt; stats per request."""
    from dflash2_mlx import Pair

    model = tiny.make_target("qwen3", seed=2)
    drafter = tiny.make_drafter(2, block_size=4)
    pair = Pair.from_models(model, None, drafter, lookup=2)
    params = [GenerationParams(max_tokens=m) for m in (9, 14, 5)]
    results = pair.generate_batch(PROMPTS[:3], params, max_batch=2)
    for prompt, p, (tokens, stats) in zip(PROMPTS, params, results):
        assert tokens == pair.generate(prompt, p)[0]
        assert stats.committed == len(tokens) == p.max_tokens and stats.rounds >= 1
    same = pair.generate_batch(PROMPTS[:2], GenerationParams(max_tokens=6))
    assert [t for t, _ in same] == [
        pair.generate(p, GenerationParams(max_tokens=6))[0] for p in PROMPTS[:2]
    ]
    with pytest.raises(ParameterError, match="3 prompts but 2"):
        pair.generate_batch(PROMPTS[:3], params[:2])
    # params as a generator are read once, and their logprobs refused as a list's are
    with pytest.raises(ParameterError, match="logprobs"):
        pair.generate_batch(PROMPTS[:2], (GenerationParams(logprobs=2) for _ in range(2)))
    with pytest.raises(ParameterError, match=r"params must be a GenerationParams .* got dict"):
        pair.generate_batch(PROMPTS[:2], {"max_tokens": 4})
    with pytest.raises(ParameterError, match=r"params\[1\] must be a GenerationParams"):
        pair.generate_batch(PROMPTS[:2], [GenerationParams(max_tokens=4), 4])


def _run(batch: BatchDecoder, ids: dict) -> dict[int, list]:
    """Step `batch` to the end; the events of each request (named by ids[rid])."""
    events: dict = {}
    while batch.busy:
        for rid, ev in batch.step():
            events.setdefault(ids[rid], []).append(ev)
    return events


def test_a_session_continues_after_its_row_leaves(decoder):
    """A request given a session (a prompt cache's) gets its caches back when it leaves the
    batch: single-sequence caches of exactly its positions (attention and Gated-DeltaNet), so
    its next turn prefills only the new tokens, batched again, and answers as a cold run."""
    params = GenerationParams(max_tokens=14)
    alone = decoder.new_session()
    first = decoder.generate(PROMPTS[0], params, alone)
    session = decoder.new_session()
    batch = BatchDecoder(decoder, max_batch=3)
    ids = {
        batch.add(PROMPTS[2], GenerationParams(max_tokens=30)): "long",
        batch.add(PROMPTS[0], params, session=session): "mine",
        batch.add(PROMPTS[1], GenerationParams(max_tokens=5)): "short",
    }
    events = _run(batch, ids)
    assert [t for ev in events["mine"] for t in ev.tokens] == first
    assert max(ev.batch_size for ev in events["mine"]) == 3
    assert session.tokens == alone.tokens and not session.in_round
    for c, ref in zip(session.target_cache, alone.target_cache):
        assert type(c) is type(ref)
        if isinstance(c, ArraysCache):  # Gated-DeltaNet: conv window and recurrent state
            got, want = c.cache, ref.cache
        else:
            assert c.offset == ref.offset == session.fed
            n = c.offset
            got = [c.keys[..., :n, :], c.values[..., :n, :]]
            want = [ref.keys[..., :n, :], ref.values[..., :n, :]]
        assert len(got) == len(want) > 0
        for a, b in zip(got, want):  # the same values, up to a batched matmul's rounding
            assert a.shape == b.shape and np.allclose(a, b, atol=1e-3), type(c).__name__
    # The next turn extends the conversation: it resumes the session, in a batch again.
    turn2 = PROMPTS[0] + first + [17, 18, 19]
    cold = decoder.generate(turn2, params)
    batch = BatchDecoder(decoder, max_batch=2)
    ids = {
        batch.add(turn2, params, session=session): "mine",
        batch.add(PROMPTS[3], GenerationParams(max_tokens=20)): "other",
    }
    events = _run(batch, ids)
    assert [t for ev in events["mine"] for t in ev.tokens] == cold
    prefill = events["mine"][0]
    assert prefill.reused_tokens == len(PROMPTS[0]) + len(first) - 1
    assert prefill.prompt_tokens == len(turn2) - prefill.reused_tokens


def test_a_cancelled_prefill_leaves_the_others_alone(decoder, monkeypatch):
    """`cancel` is polled between prefill chunks: the request is dropped without an event;
    `on_prefill` sees the others' prefill events while their sessions hold their caches."""
    monkeypatch.setattr(decoder, "prefill_chunk", 4)
    params = GenerationParams(max_tokens=12)
    batch = BatchDecoder(decoder, max_batch=3)
    polls, seen = [], []

    def observe(ev):
        assert ev.prefill
        seen.append(sum(c.nbytes for c in session.target_cache))

    session = decoder.new_session()
    ids = {
        batch.add(PROMPTS[0], params, session=session, on_prefill=observe): 0,
        batch.add(PROMPTS[2], params, cancel=lambda: polls.append(1) or True): 2,
        batch.add(PROMPTS[1], params): 1,
    }
    events = _run(batch, ids)
    assert 2 not in events and len(polls) == 1
    assert len(seen) == 1 and seen[0] > 0  # the session still held its own caches
    for i in (0, 1):
        assert [t for ev in events[i] for t in ev.tokens] == decoder.generate(PROMPTS[i], params)
        assert events[i][0].queue_ms >= 0.0


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_rollback_hands_each_row_back_in_position_order(family, monkeypatch):
    """Rows verified together and rolled back by different amounts (rejected tails refilled
    with each row's oldest columns; a row too short for that makes all shift right, as the
    first round here does), then extracted: each equals the cache of its accepted tokens fed
    alone, column for column, and continues to the same next logits."""
    shifted = []
    finalize = tbatch.BatchKVCache.finalize
    monkeypatch.setattr(tbatch.BatchKVCache, "finalize", lambda c: shifted.append(1) or finalize(c))
    model = tiny.make_target(family)
    adapter = TargetAdapter(model, [1])
    prompts = [list(range(3, 15)), [7, 8, 9, 10, 11, 12, 13, 14, 15], list(range(20, 34)), [5]]
    singles = []
    for p in prompts:
        cache = adapter.make_cache()
        adapter.prefill(mx.array([p]), cache, 64, 1)
        singles.append(cache)
    batch = tbatch.merge(singles)
    rng = np.random.default_rng(0)
    fed = [list(p) for p in prompts]
    moved = False
    for step in range(6):
        width = 6 if step == 0 else 4
        ids = rng.integers(1, tiny.VOCAB, size=(len(prompts), width)).tolist()
        fwd = adapter.forward(mx.array(ids), batch.layers)
        keeps = [int(k) for k in rng.integers(1, width + 1, size=len(prompts))]
        if step == 0:
            keeps = [6, 5, 6, 1]  # the 1-token row keeps 2 columns and rejects 5
        elif len(set(keeps)) == 1:
            keeps[0] = 1 if keeps[0] > 1 else 2
        tbatch.rollback(batch, fwd, keeps, width)
        for row, (k, new) in enumerate(zip(keeps, ids)):
            fed[row] += new[:k]
        order = batch.order
        moved |= any(np.any(np.diff(r[r >= 0]) < 0) for r in order)
    assert moved, "no row was refilled out of order: the test does not exercise the moves"
    assert shifted, "no round shifted the rows right: the short-row path is not exercised"
    probe = mx.array([[5]])
    for row, tokens in enumerate(fed):
        alone = adapter.make_cache()
        adapter.prefill(mx.array([tokens]), alone, 64, 1)
        back = tbatch.extract(batch, row)
        for a, b in zip(alone, back):
            if hasattr(a, "keys") and a.keys is not None:
                assert a.offset == b.offset == len(tokens)
                np.testing.assert_allclose(
                    np.array(a.keys[..., : a.offset, :]), np.array(b.keys), atol=2e-4
                )
        want = adapter.forward(probe, alone).logits
        got = adapter.forward(probe, back).logits
        np.testing.assert_allclose(np.array(want), np.array(got), atol=2e-3)


def test_a_sliding_window_target_keeps_rows_in_order():
    """A window mask measures distance in cache columns, so a windowed target's rows must not
    be refilled out of order: batched greedy output equals each alone with prompts and answers
    well past the window, and rollback keeps every row's columns in position order."""
    window = dict(sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2)
    model = tiny.make_target("llama", **window)
    drafter = tiny.fit_drafter(model, tiny.make_drafter(2, block_size=8), FIT_PROMPTS, steps=150)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    assert tbatch.windowed(dec.target)
    assert not tbatch.windowed(TargetAdapter(tiny.make_target(), [1]))
    params = [GenerationParams(max_tokens=m) for m in MAX_TOKENS]
    alone = [dec.generate(p, g) for p, g in zip(PROMPTS, params)]
    batch = BatchDecoder(dec, max_batch=4)
    out = [[] for _ in PROMPTS]
    accepted = set()
    for i, ev in batch.stream(zip(PROMPTS, params)):
        out[i].extend(ev.tokens)
        if ev.batch_size > 1 and not ev.prefill:
            accepted.add(ev.accepted)
        if batch.cache is not None:
            for row in batch.cache.order:
                assert np.all(np.diff(row[row >= 0]) == 1)
    assert out == alone
    assert len(accepted) > 1, accepted  # rows rolled back by different amounts


def test_a_failed_requests_stats_count_no_round_for_its_error_event(decoder):
    """A request whose logits processor raises leaves with an error event (no tokens): its
    GenerationStats count the rounds that ran, so tokens = prefill + accepted + rounds."""
    from dflash2_mlx import GenerationStats

    calls = []

    def third_call_fails(tokens, logits):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("boom")
        return logits

    batch = BatchDecoder(decoder, max_batch=2)
    bad = batch.add(
        PROMPTS[0], GenerationParams(max_tokens=20, logits_processors=[third_call_fails])
    )
    batch.add(PROMPTS[1], GenerationParams(max_tokens=20))
    stats, tokens, last = GenerationStats(), [], None
    while batch.busy:
        for rid, ev in batch.step():
            if rid == bad:
                stats.add(ev)
                tokens += ev.tokens
                last = ev
    assert last.finish_reason == "error" and str(last.error) == "boom"
    assert stats.committed == len(tokens) == 1 + stats.accepted + stats.rounds
