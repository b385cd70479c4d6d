"""A Session serves one generation at a time, a batch left midway leaves its sessions usable,
and the batched library front end checks and applies what the single one does."""

import gc
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import tiny

from dflash2_mlx import GenerationParams, Pair, ParameterError

P0, P1 = [1, 2, 3, 4, 5, 6], [9, 8, 7]
GREEDY = GenerationParams(max_tokens=12)


@pytest.fixture(scope="module")
def pair():
    return Pair.from_models(tiny.make_target("llama", seed=1), None, tiny.make_drafter(2, 4))


def test_a_session_in_use_is_refused_to_a_second_generation(pair):
    s = pair.new_session()
    batch = pair.batch()
    batch.add(P0, GREEDY, session=s)
    with pytest.raises(ParameterError, match="this session is in use"):
        batch.add(P0 + [11, 12], GREEDY, session=s)
    with pytest.raises(ParameterError, match="this session is in use"):
        next(pair.stream(P0, GREEDY, session=s))
    out = []
    while batch.busy:
        out += [t for _, ev in batch.step() for t in ev.tokens]
    assert out == pair.generate(P0, GREEDY)[0]
    # free again once its request has left: it continues the conversation
    longer = P0 + out + [11, 12]
    assert pair.generate(longer, GREEDY, session=s)[0] == pair.generate(longer, GREEDY)[0]


def test_interleaved_streams_on_one_session_are_refused_and_a_closed_one_frees_it(pair):
    s = pair.new_session()
    first = pair.stream(P0, GREEDY, session=s)
    next(first)
    with pytest.raises(ParameterError, match="this session is in use"):
        next(pair.stream(P1, GREEDY, session=s))
    first.close()  # a consumer that stops early
    assert pair.generate(P1, GREEDY, session=s)[0] == pair.generate(P1, GREEDY)[0]


def test_a_cancelled_request_frees_its_session(pair):
    s = pair.new_session()
    batch = pair.batch()
    rid = batch.add(P0, GREEDY, session=s)
    batch.cancel(rid)  # still queued
    assert not s.busy
    rid = batch.add(P0, GREEDY, session=s)
    batch.add(P1, GREEDY)
    batch.step()
    batch.cancel(rid)  # in the batch
    assert not s.busy
    assert pair.generate(P1, GREEDY, session=s)[0] == pair.generate(P1, GREEDY)[0]


def test_a_session_left_in_a_dropped_batch_is_cleared_on_its_next_use(pair):
    s = pair.new_session()
    batch = pair.batch()
    batch.add(P0, GREEDY, session=s)
    batch.add(P1, GREEDY)
    batch.step()
    batch.step()  # its rows live in the batch cache now
    del batch
    gc.collect()
    prompt = P0 + [50, 51]
    assert pair.generate(prompt, GREEDY, session=s)[0] == pair.generate(prompt, GREEDY)[0]


def test_a_request_whose_prefill_step_fails_leaves_alone_with_its_error(pair):
    batch = pair.batch()
    with pytest.raises(ParameterError, match="on_prefill must be a callable or None, got 5"):
        batch.add(P1, GREEDY, on_prefill=5)
    assert not batch.busy

    def fails(event):
        raise RuntimeError("the caller's bug")

    s = pair.new_session()
    a = batch.add(P0, GREEDY)
    b = batch.add(P1, GREEDY, session=s, on_prefill=fails)
    out = {a: [], b: []}
    errors = []
    while batch.busy:
        for rid, ev in batch.step():
            out[rid] += ev.tokens
            if ev.error is not None:
                errors.append((rid, ev.finish_reason, str(ev.error)))
    assert errors == [(b, "error", "the caller's bug")] and out[b] == []
    assert out[a] == pair.generate(P0, GREEDY)[0]  # the other one, whole
    assert pair.generate(P1, GREEDY, session=s)[0] == pair.generate(P1, GREEDY)[0]


def test_a_whole_batched_run_raises_a_requests_failure(pair, monkeypatch):
    first = pair.decoder._first

    def fails_on_p1(prefill, run):  # this decoder's own first-token step, for one prompt
        if prefill.prompt == P1:
            raise RuntimeError("P1 broke")
        return first(prefill, run)

    monkeypatch.setattr(pair.decoder, "_first", fails_on_p1)
    batch = pair.batch()
    with pytest.raises(RuntimeError, match="P1 broke"):
        list(batch.stream([(P0, GREEDY), (P1, GREEDY)]))
    assert not batch.busy  # the other one does not run on


def test_a_bad_request_in_a_batch_stream_runs_none_of_them(pair):
    batch = pair.batch()
    with pytest.raises(ParameterError, match="^request 1 of the batch: .*must be token ids"):
        batch.stream([(P0, GREEDY), ("text", GREEDY)])  # at the call, as stream alone
    assert not batch.busy
    with pytest.raises(ParameterError, match="^request 0 of the batch: .*empty"):
        pair.stream_batch([[]], GREEDY)
    with pytest.raises(ParameterError, match=r"^request 1 of the batch: the prompt\[1\] = "):
        pair.generate_batch([P0, [5, 10**9]], GREEDY)
    assert batch.generate([(P1, GREEDY)]) == [pair.generate(P1, GREEDY)[0]]


def test_a_batch_stream_makes_each_constraint_once_and_two_streams_do_not_mix(pair):
    """Validated at the call, a stream still calls a request's constraint factory once (its
    state is the generation's); a second stream made before the first runs is refused when it
    starts, not fed the first one's events."""
    made = []

    class Free:  # allows anything: the tokens are the greedy ones
        def allowed(self, drafts):
            return np.ones((len(drafts) + 1, pair.vocab_size), dtype=bool)

        def commit(self, tokens):
            pass

        def forced(self):
            return []

    def factory():
        made.append(1)
        return Free()

    params = replace(GREEDY, constraint=factory)
    batch = pair.batch()
    assert batch.generate([(P0, params)]) == [pair.generate(P0, GREEDY)[0]]
    assert len(made) == 1
    first, second = batch.stream([(P0, GREEDY)]), batch.stream([(P1, GREEDY)])
    next(first)
    with pytest.raises(RuntimeError, match="busy"):
        next(second)
    first.close()
    assert not batch.busy


@pytest.mark.parametrize("params", [None, 5])
def test_generate_batch_names_params_that_are_not_generation_params(pair, params):
    with pytest.raises(ParameterError, match="params must be a GenerationParams or a list"):
        pair.generate_batch([P0, P1], params)


def test_pair_batch_stops_at_the_tokenizers_eos_as_generate_does():
    model = tiny.make_target("llama", seed=1)
    ref = tiny.greedy_reference(model, P0, 10)
    eos = ref[4]
    tok = SimpleNamespace(eos_token_ids={eos})
    pair = Pair.from_models(model, tok, tiny.make_drafter(2, 4))
    alone = pair.generate(P0, GenerationParams(max_tokens=10))[0]
    assert alone == ref[: ref.index(eos) + 1]
    assert pair.batch().generate([(P0, GenerationParams(max_tokens=10))]) == [alone]


def test_a_drafter_shared_by_two_pairs_drafts_for_the_batching_one(pair):
    other = Pair.from_models(tiny.make_target("llama", seed=3), None, pair.drafter)
    assert not pair.drafter.is_bound(pair.decoder.binding)  # `other` bound it last
    batch = pair.batch()
    batch.add(P0, GREEDY)
    batch.add(P1, GREEDY)
    batch.step()  # both prefilled and joined
    events = batch.step()  # one round over both rows: their drafts from one drafter pass
    assert [ev.source for _, ev in events] == ["drafter", "drafter"]
    assert pair.drafter.is_bound(pair.decoder.binding)
    other.generate(P0, GREEDY)  # and back


def test_stop_ids_outside_the_vocabulary_are_refused(pair):
    params = GenerationParams(max_tokens=4, stop_token_ids={tiny.VOCAB + 5})
    with pytest.raises(ParameterError, match=r"stop_token_ids\[0\] = .* outside the vocabulary"):
        pair.generate(P0, params)
    with pytest.raises(ParameterError, match="outside the vocabulary"):
        pair.batch().add(P0, params)


@pytest.mark.parametrize(
    "fields", [dict(block_size=4), dict(lookup_block=8), dict(prediction=[5, 6])]
)
def test_drafting_knobs_without_speculation_are_refused(fields):
    with pytest.raises(ParameterError, match="has no effect with speculative=False"):
        GenerationParams(speculative=False, **fields)


def _run_to_end(batch, rids):
    out, errors = {r: [] for r in rids}, []
    while batch.busy:
        for rid, ev in batch.step():
            out[rid] += ev.tokens
            if ev.error is not None:
                errors.append((rid, ev.finish_reason, str(ev.error)))
    return out, errors


@pytest.fixture(scope="module")
def hybrid():
    return Pair.from_models(tiny.make_target("qwen3_5", seed=2), None, tiny.make_drafter(2, 4))


@pytest.mark.parametrize("max_batch,family", [(4, "llama"), (1, "llama"), (4, "qwen3_5")])
def test_a_request_whose_processor_raises_leaves_alone_and_the_others_go_on(
    pair, hybrid, max_batch, family
):
    """A logits processor that raises at its n-th call (the first token, or a batched round)
    ends its own request with the error; the other returns what it returns alone (its
    attention and Gated-DeltaNet rows rolled back beside a row that kept nothing), and the
    failed request's session starts clean on its next use."""
    pair = hybrid if family == "qwen3_5" else pair
    long = GenerationParams(max_tokens=30)
    for fail_at in (1, 2, 3, 5):
        calls = [0]

        def flaky(tokens, logits):
            calls[0] += 1
            if calls[0] == fail_at:
                raise RuntimeError("processor failed")
            return logits

        s = pair.new_session()
        batch = pair.batch(max_batch=max_batch)
        a = batch.add(P0, long)
        b = batch.add(P1, GenerationParams(max_tokens=30, logits_processors=(flaky,)), session=s)
        out, errors = _run_to_end(batch, (a, b))
        assert errors == [(b, "error", "processor failed")], fail_at
        assert out[a] == pair.generate(P0, long)[0]
        assert not s.busy
        prompt = P1 + [40, 41]
        assert pair.generate(prompt, GREEDY, session=s)[0] == pair.generate(prompt, GREEDY)[0]


def test_a_request_whose_proposing_raises_leaves_alone(pair, monkeypatch):
    """Its own proposal (a grammar's forced tokens, a lookup) raising in a batched round."""
    s = pair.new_session()
    model_free = pair.decoder._model_free
    seen = [0]

    def fails_for_s(session, run):
        if session is s:
            seen[0] += 1
            if seen[0] == 3:
                raise ValueError("grammar broke")
        return model_free(session, run)

    monkeypatch.setattr(pair.decoder, "_model_free", fails_for_s)
    long = GenerationParams(max_tokens=30)
    batch = pair.batch()
    a = batch.add(P0, long)
    b = batch.add(P1, long, session=s)
    out, errors = _run_to_end(batch, (a, b))
    assert errors == [(b, "error", "grammar broke")] and seen[0] == 3
    assert out[a] == pair.generate(P0, long)[0]
    monkeypatch.undo()
    assert pair.generate(P1, GREEDY, session=s)[0] == pair.generate(P1, GREEDY)[0]


def test_a_round_whose_shared_forward_raises_ends_every_request_and_their_sessions_clear(
    pair, monkeypatch
):
    """The batch's own verify forward raising leaves the batch's caches mid-round: every
    running request leaves, the error is raised, and a session it held starts clean."""
    forward = pair.decoder.target.forward
    for fail_at in (1, 3):
        calls = [0]

        def flaky(ids, cache, **kw):
            if ids.shape[0] > 1:  # a batched verify (not a prefill)
                calls[0] += 1
                if calls[0] == fail_at:
                    raise RuntimeError("forward failed")
            return forward(ids, cache, **kw)

        monkeypatch.setattr(pair.decoder.target, "forward", flaky)
        s = pair.new_session()
        batch = pair.batch()
        batch.add(P0, GenerationParams(max_tokens=30), session=s)
        batch.add(P1, GenerationParams(max_tokens=30))
        with pytest.raises(RuntimeError, match="forward failed"):
            while batch.busy:
                batch.step()
        monkeypatch.undo()
        assert not batch.busy and not s.busy and s.in_round
        prompt = P0 + [40, 41]
        assert pair.generate(prompt, GREEDY, session=s)[0] == pair.generate(prompt, GREEDY)[0]


def test_what_a_session_can_reuse_of_a_next_prompt(pair):
    """Session.reusable (the chat's "prefilling N prompt tokens" counts the rest) is what
    the next generation's prefill keeps: its prefix shared with the prompt."""
    session = pair.new_session()
    tokens, _ = pair.generate(P0, GREEDY, session)
    held = P0 + tokens
    assert session.reusable(held + [3, 4]) == len(held) - 1  # the last token is fed anew
    assert session.reusable(P0[:3] + [40]) == 3 and session.reusable(P1) == 0
    event = next(e for e in pair.stream(held + [3, 4], GREEDY, session) if e.prefill)
    assert event.reused_tokens == len(held) - 1
    session.in_round = True  # an interrupted round: its caches are cleared on next use
    assert session.reusable(held) == 0


def test_a_reused_session_steps_on_alternating_threads(pair):
    """An async app advances a stream from whichever executor thread is free: on a session
    rolled back to a shared prefix, the drafter cache's trim was left lazy on the first
    thread's stream ("There is no Stream(cpu, 1) in current thread" on the second)."""
    import concurrent.futures as cf

    import mlx.core as mx

    want = pair.generate(P0, GREEDY)[0]
    session = pair.new_session()
    pair.generate(P0, GREEDY, session)  # it now holds P0 and an answer: the next one trims
    threads = cf.ThreadPoolExecutor(1), cf.ThreadPoolExecutor(1)
    try:
        stream, out = pair.stream(P0, GREEDY, session), []
        for n in range(100):
            event = threads[n % 2].submit(next, stream, None).result()
            if event is None:
                break
            out += event.tokens
        assert out == want
    finally:
        for t in threads:
            t.submit(mx.clear_streams).result()
            t.shutdown()
