"""A request joining running rows is prefilled a chunk per step between their rounds
(engine/batch.py `prefill_step`, engine/prefill.py): the running rows keep streaming while a
long prompt is prefilled, and every request still returns what it returns alone. With the
same chunk size alone and joined, the joiner's prefill runs exactly the same chunks."""

import pytest
from test_batch import PROMPTS, _decoder

from dflash2_mlx import GenerationParams, ParameterError
from dflash2_mlx.engine.batch import BatchDecoder

CHUNK = 8
LONG = [(7 * i + 3) % 90 + 1 for i in range(61)]  # 61 tokens: 8 chunks of 8


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def decoder(request):
    dec = _decoder(request.param)
    dec.prefill_chunk = CHUNK
    return dec


def _steps_until_joined(batch: BatchDecoder, ids: dict, out: dict, joiner) -> list[list]:
    """Step until `joiner`'s prefill event (or until it is gone); each step's events."""
    steps = []
    while batch.busy:
        events = batch.step()
        steps.append(events)
        for rid, ev in events:
            out.setdefault(ids[rid], []).extend(ev.tokens)
        if any(ids[rid] == joiner for rid, _ in events):
            break
        if all(w.rid not in ids or ids[w.rid] != joiner for w in batch.waiting):
            break  # dropped
    return steps


def trims(decoder) -> bool:
    """Every cache of the target trims (no recurrent state)."""
    return all(c.is_trimmable() for c in decoder.target.make_cache())


def _finish(batch: BatchDecoder, ids: dict, out: dict) -> None:
    while batch.busy:
        for rid, ev in batch.step():
            out.setdefault(ids[rid], []).extend(ev.tokens)


def _running(batch: BatchDecoder, ids: dict, out: dict, n: int = 2) -> None:
    """Two rows running (a few rounds done) before anything else joins."""
    params = GenerationParams(max_tokens=60)
    ids[batch.add(PROMPTS[0], params)] = "a"
    ids[batch.add(PROMPTS[1], params)] = "b"
    for _ in range(n):
        for rid, ev in batch.step():
            out.setdefault(ids[rid], []).extend(ev.tokens)


@pytest.mark.parametrize("chunks_per_step", [1, 3])
def test_a_long_prompt_joins_a_chunk_per_step(decoder, chunks_per_step):
    params = GenerationParams(max_tokens=20)
    alone = {
        "a": decoder.generate(PROMPTS[0], GenerationParams(max_tokens=60)),
        "b": decoder.generate(PROMPTS[1], GenerationParams(max_tokens=60)),
        "long": decoder.generate(LONG, params),
    }
    batch = BatchDecoder(decoder, max_batch=4, prefill_step=chunks_per_step * CHUNK)
    ids, out = {}, {}
    _running(batch, ids, out)
    ids[batch.add(LONG, params)] = "long"
    steps = _steps_until_joined(batch, ids, out, "long")
    assert -(-len(LONG) // CHUNK) == 8  # chunks
    assert len(steps) == -(-8 // chunks_per_step)  # whole chunks per step, as many as fit
    for events in steps[:-1]:  # while it prefilled, the others' rounds went on
        got = {ids[rid]: ev for rid, ev in events}
        assert set(got) == {"a", "b"}, got
        assert all(not ev.prefill and ev.tokens and ev.batch_size == 2 for ev in got.values())
    prefill = next(ev for rid, ev in steps[-1] if ids[rid] == "long")
    assert prefill.prefill and prefill.prompt_tokens == len(LONG) and prefill.reused_tokens == 0
    assert prefill.batch_size == 3 and prefill.prefill_ms > 0 and prefill.queue_ms >= 0
    # the step that finished its prefill sent its first token at once, with no round; the
    # next step's round runs it with the others
    assert [ids[rid] for rid, ev in steps[-1]] == ["long"]
    following = batch.step()
    assert {ids[rid]: ev.batch_size for rid, ev in following} == {"a": 3, "b": 3, "long": 3}
    for rid, ev in following:
        out.setdefault(ids[rid], []).extend(ev.tokens)
    _finish(batch, ids, out)
    assert out == alone


def test_nothing_running_a_step_prefills_one_chunk_and_a_short_prompt_goes_ahead(decoder):
    """With nothing running a step feeds one prefill chunk, so a request that arrives
    meanwhile is taken at the next step; a prompt that fits in the step's budget goes ahead
    of the long one (a chat's short turn does not wait for a pasted document), which then
    goes on in the smaller chunks of a step with rows running."""
    params = GenerationParams(max_tokens=6)
    batch = BatchDecoder(decoder, max_batch=4, prefill_step=3)
    ids = {batch.add(LONG, params): "long"}
    assert batch.step() == [] and batch.waiting[0].prefill.feed.fed == CHUNK
    short = PROMPTS[0]
    assert len(short) <= CHUNK
    ids[batch.add(short, params)] = "short"
    second = batch.step()  # its first token goes out at once; its first round comes next
    assert [(ids[rid], ev.prefill) for rid, ev in second] == [("short", True)]
    assert [ids[w.rid] for w in batch.waiting] == ["long"]
    third = batch.step()
    assert [(ids[rid], ev.prefill) for rid, ev in third] == [("short", False)]
    out = {}
    for rid, ev in second + third:
        out.setdefault(ids[rid], []).extend(ev.tokens)
    _finish(batch, ids, out)
    assert out["long"] == decoder.generate(LONG, params)
    assert out["short"] == decoder.generate(short, params)
    for bad in (0, 2.5, True, None):
        with pytest.raises(ParameterError, match="prefill_step"):
            BatchDecoder(decoder, prefill_step=bad)


def test_a_joiner_cancelled_mid_prefill_is_dropped(decoder):
    params = GenerationParams(max_tokens=20)
    polls = []
    session = decoder.new_session()
    batch = BatchDecoder(decoder, max_batch=4, prefill_step=CHUNK)
    ids, out = {}, {}
    _running(batch, ids, out)
    cancel = lambda: polls.append(1) or len(polls) > 2  # noqa: E731  (true at the third poll)
    ids[batch.add(LONG, params, session=session, cancel=cancel)] = "long"
    steps = _steps_until_joined(batch, ids, out, "long")
    assert len(steps) == 4 and len(polls) == 3  # polled before chunks 2, 3 and 4
    assert "long" not in out
    if trims(decoder):  # dropped, the 3 chunks it fed kept
        assert not session.in_round and session.tokens == LONG[: 3 * CHUNK + 1]
    else:  # dropped: its recurrent state holds part of a prompt, cleared on its next use
        assert session.in_round
    rid = batch.add(LONG, params, session=session)  # cancelled by the caller this time
    ids[rid] = "again"
    for rid_, ev in batch.step():
        out.setdefault(ids[rid_], []).extend(ev.tokens)
    assert batch.waiting and batch.waiting[0].prefill is not None
    batch.cancel(rid)
    assert not batch.waiting
    _finish(batch, ids, out)
    assert "again" not in out
    assert out["a"] == decoder.generate(PROMPTS[0], GenerationParams(max_tokens=60))
    assert out["b"] == decoder.generate(PROMPTS[1], GenerationParams(max_tokens=60))
    # the session recovers: its next use starts clean and answers as a cold run
    assert decoder.generate(LONG, params, session) == decoder.generate(LONG, params)


class _CtrlCOnce:
    """Stands in for a layer: raises KeyboardInterrupt at its next call once armed (a Ctrl-C
    in the middle of a prefill chunk), else is the layer."""

    def __init__(self, layer):
        self.layer, self.armed = layer, False

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return self.layer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.layer, name)


def test_a_ctrl_c_mid_prefill_chunk_drops_that_request(decoder):
    """A KeyboardInterrupt inside a joiner's prefill chunk leaves its caches half-fed: the
    request leaves (it was once kept, and the next step fed the chunk again over them), its
    session is free and answers as a cold run; the running rows go on, exact."""
    params = GenerationParams(max_tokens=20)
    layers = decoder.target.layers
    ctrl_c = layers[-1] = _CtrlCOnce(layers[-1])
    try:
        batch = BatchDecoder(decoder, max_batch=4, prefill_step=CHUNK)
        ids, out = {}, {}
        _running(batch, ids, out)
        session = decoder.new_session()
        ids[batch.add(LONG, params, session=session)] = "long"
        for rid, ev in batch.step():  # the joiner's first chunk, the rows' round
            out.setdefault(ids[rid], []).extend(ev.tokens)
        assert batch.waiting[0].prefill is not None and not batch.waiting[0].prefill.done
        ctrl_c.armed = True
        with pytest.raises(KeyboardInterrupt):
            batch.step()  # the joiner's second chunk comes before the rows' round
        assert not batch.waiting and not session.busy
        _finish(batch, ids, out)
        assert "long" not in out
        assert out["a"] == decoder.generate(PROMPTS[0], GenerationParams(max_tokens=60))
        assert out["b"] == decoder.generate(PROMPTS[1], GenerationParams(max_tokens=60))
        assert decoder.generate(LONG, params, session) == decoder.generate(LONG, params)
    finally:
        layers[-1] = ctrl_c.layer


def test_a_joiner_with_a_cached_prefix_prefills_only_the_rest(decoder):
    params = GenerationParams(max_tokens=12)
    session = decoder.new_session()
    first = decoder.generate(LONG[:20], params, session)
    turn2 = LONG[:20] + first + LONG[20:50]
    cold = decoder.generate(turn2, params)
    batch = BatchDecoder(decoder, max_batch=4, prefill_step=CHUNK)
    ids, out = {}, {}
    _running(batch, ids, out)
    ids[batch.add(turn2, params, session=session)] = "turn2"
    steps = _steps_until_joined(batch, ids, out, "turn2")
    prefill = next(ev for rid, ev in steps[-1] if ids[rid] == "turn2")
    reused = 20 + len(first) - 1
    assert prefill.reused_tokens == reused and prefill.prompt_tokens == len(turn2) - reused
    assert len(steps) == -(-prefill.prompt_tokens // CHUNK) > 1
    _finish(batch, ids, out)
    assert out["turn2"] == cold
    assert session.tokens == turn2 + cold and not session.in_round


def test_a_joiner_cancelled_mid_prefill_keeps_the_prefix_its_session_held(decoder):
    """A cancelled joiner (a client gone during a long prompt) keeps the chunks it fed where
    every cache trims, else rolls them back (Gated-DeltaNet state restored): its session
    holds the conversation and the retried prompt prefills only what it lacks, exactly."""
    params = GenerationParams(max_tokens=12)
    session = decoder.new_session()
    first = decoder.generate(LONG[:20], params, session)
    turn2 = LONG[:20] + first + LONG[20:50]
    held = 20 + len(first) - 1
    batch = BatchDecoder(decoder, max_batch=4, prefill_step=CHUNK)
    ids, out = {}, {}
    _running(batch, ids, out)
    polls = []
    cancel = lambda: polls.append(1) or len(polls) > 1  # noqa: E731  (true at the second poll)
    ids[batch.add(turn2, params, session=session, cancel=cancel)] = "gone"
    _steps_until_joined(batch, ids, out, "gone")
    assert "gone" not in out and len(polls) == 2
    kept = 2 * CHUNK if trims(decoder) else 0  # polled before each chunk but the first
    assert not session.in_round and session.tokens == turn2[: held + kept + 1]
    ids[batch.add(turn2, params, session=session)] = "retry"
    steps = _steps_until_joined(batch, ids, out, "retry")
    prefill = next(ev for rid, ev in steps[-1] if ids[rid] == "retry")
    assert prefill.reused_tokens == held + kept
    _finish(batch, ids, out)
    assert out["retry"] == decoder.generate(turn2, params)
    assert out["a"] == decoder.generate(PROMPTS[0], GenerationParams(max_tokens=60))


def test_a_running_request_counts_the_time_it_waited_on_a_joiners_prefill(decoder):
    """decode_ms is the wall time after the first token: a row's rounds, and the steps it
    waited while another request's prefill chunks ran (RoundEvent.wait_ms)."""
    import time

    from dflash2_mlx.engine.events import GenerationStats

    polls = []

    def slow_cancel():  # polled between the joiner's prefill chunks: 30 ms each
        polls.append(time.sleep(0.03))
        return False

    batch = BatchDecoder(decoder, max_batch=4, prefill_step=CHUNK)
    rid = batch.add(PROMPTS[0], GenerationParams(max_tokens=40))
    stats, began, first, last = GenerationStats(), None, None, None
    while batch.busy:
        if stats.rounds == 2:
            batch.add(LONG, GenerationParams(max_tokens=4), cancel=slow_cancel)
        before = time.perf_counter()
        for r, ev in batch.step():
            if r == rid:
                stats.add(ev)
                last = time.perf_counter()
                if ev.prefill:  # its first round may run in the same step
                    began, first = before, last
    waited = 0.03 * len(polls)
    assert len(polls) >= 5 and stats.wait_ms >= 1000 * waited * 0.9
    assert 0.9 * (last - first) * 1000 <= stats.decode_ms <= (last - began) * 1000
