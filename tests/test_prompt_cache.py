"""The prompt cache across requests (engine/prompt_cache.py), library level: a next turn
prefills only its new tokens and stays exactly greedy, for attention and hybrid
(Gated-DeltaNet) targets; the byte budget evicts least recently used entries; leases in flight
at the same time never share or corrupt a session."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import tiny

from dflash2_mlx import GenerationParams, SpeculativeDecoder
from dflash2_mlx.engine.prompt_cache import PromptCache, common_prefix, session_nbytes
from dflash2_mlx.errors import ParameterError
from dflash2_mlx.target.adapter import TargetAdapter

PARAMS = GenerationParams(max_tokens=12, block_size=4)
TURN1 = [3, 14, 15, 9, 26, 5, 6, 7]


def decoder(family: str, prefill_chunk: int = 512) -> SpeculativeDecoder:
    model = tiny.make_target(family)
    drafter = tiny.make_drafter(2)
    adapter = TargetAdapter(model, drafter.config.target_layer_ids)
    return SpeculativeDecoder(adapter, drafter, lookup=3, prefill_chunk=prefill_chunk)


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def dec(request):
    return decoder(request.param)


def run(dec, cache, prompt):
    """One request through the cache: (output tokens, prefill event, lease)."""
    with cache.lease(prompt) as lease:
        events = []
        for ev in dec.stream(prompt, PARAMS, lease.session):
            lease.observe(ev)
            events.append(ev)
    return [t for ev in events for t in ev.tokens], events[0], lease


def cold(dec, prompt):
    return tiny.greedy_reference(dec.target.model, prompt, PARAMS.max_tokens)


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 9], 10) == 2
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4, 5], 3) == 3
    assert common_prefix([7], [1], 5) == 0 and common_prefix([], [1], 5) == 0
    a = list(range(1000))
    assert common_prefix(a, a[:637] + [-1], 2000) == 637


def test_budget_must_be_positive(dec):
    with pytest.raises(ParameterError, match="max_bytes"):
        PromptCache(dec, 0)


def test_bad_arguments_are_refused_with_their_names(dec):
    with pytest.raises(ParameterError, match="decoder must be a SpeculativeDecoder"):
        PromptCache(object(), 1 << 20)  # e.g. a Pair instead of its .decoder
    cache = PromptCache(dec, 1 << 20)
    for bad, message in (("123", "not text"), ([1.7], "not a token id"), (None, "sequence")):
        with pytest.raises(ParameterError, match=message):
            cache.lease(bad)


def test_next_turn_prefills_only_new_tokens(dec):
    """Turn 2 extends turn 1 + its answer: only the new tokens are prefilled. A turn whose
    history re-renders the answer differently resumes where it diverges (attention) or at
    turn 1's prompt's last token (hybrid: the state stored there). Outputs equal cold greedy
    runs."""
    cache = PromptCache(dec, 1 << 30)
    out1, ev, lease = run(dec, cache, TURN1)
    assert out1 == cold(dec, TURN1) and ev.reused_tokens == 0 and lease.served == 0
    turn2 = TURN1 + out1 + [40, 41, 42]
    out2, ev, lease = run(dec, cache, turn2)
    assert ev.reused_tokens == lease.served == len(TURN1) + len(out1) - 1
    assert ev.prompt_tokens == 4 and out2 == cold(dec, turn2)
    rerendered = TURN1 + out1[:5] + [1, 40, 41]  # diverges inside turn 1's answer
    out3, ev, lease = run(dec, cache, rerendered)
    want = len(TURN1) + 5 if cache.trimmable else len(TURN1) - 1
    assert ev.reused_tokens == lease.served == want
    assert out3 == cold(dec, rerendered)
    turn4 = turn2 + out2 + [50, 51]  # turn 2's conversation is still there
    out4, ev, _ = run(dec, cache, turn4)
    assert ev.reused_tokens == len(turn2) + len(out2) - 1 and out4 == cold(dec, turn4)
    st = cache.stats()
    assert (st.hits, st.misses, st.evictions) == (3, 1, 0)
    assert st.nbytes > 0 and st.entries >= 2


def test_the_same_prompt_sent_again_resumes_at_its_last_token(dec):
    """A regeneration or a retry sends the same prompt: it resumes from the state at the
    prompt's last token (a recurrent one too, stored there mid-prefill; the state at the
    prompt's end can serve no prompt ending there, whose last token is fed anew), prefills
    that token alone and answers as a cold run; the next turn resumes too."""
    cache = PromptCache(dec, 1 << 30)
    prompt = list(range(3, 40))
    out1, first, _ = run(dec, cache, prompt)
    assert first.reused_tokens == 0 and out1 == cold(dec, prompt)
    for _ in range(2):
        again, ev, _ = run(dec, cache, prompt)
        assert ev.reused_tokens == len(prompt) - 1 and again == out1
    turn2 = prompt + out1[:-1] + [40, 41]
    out2, ev, _ = run(dec, cache, turn2)
    assert ev.reused_tokens >= len(prompt) - 1 and out2 == cold(dec, turn2)


def test_lru_eviction_under_a_small_budget():
    dec = decoder("llama")
    probe = PromptCache(dec, 1 << 30)
    run(dec, probe, TURN1)
    one = probe.stats().nbytes
    cache = PromptCache(dec, one + one // 2)  # room for one conversation
    convs = [[60 + i] + TURN1[1:] for i in range(3)]
    outs = [run(dec, cache, c)[0] for c in convs]
    st = cache.stats()
    assert st.entries == 1 and st.evictions == 2 and st.nbytes <= cache.max_bytes
    # The most recent conversation resumes; the evicted ones start cold, still exact.
    nxt = convs[2] + outs[2] + [40]
    out, ev, _ = run(dec, cache, nxt)
    assert ev.reused_tokens == len(convs[2]) + len(outs[2]) - 1 and out == cold(dec, nxt)
    nxt = convs[0] + outs[0] + [40]
    out, ev, _ = run(dec, cache, nxt)
    assert ev.reused_tokens == 0 and out == cold(dec, nxt)
    # A state larger than the whole budget is not kept, nor does it push out the others
    # first (it emptied the cache of every other conversation).
    tiny_cache = PromptCache(dec, one // 4)
    run(dec, tiny_cache, TURN1)
    assert tiny_cache.stats().entries == 0 and tiny_cache.stats().evictions == 1
    run(dec, cache, convs[1])
    run(dec, cache, [70] + TURN1 * 4)  # another conversation, 4 times the state: past the budget
    st = cache.stats()
    assert st.entries == 1 and st.nbytes <= cache.max_bytes
    nxt = convs[1] + outs[1] + [41]
    assert run(dec, cache, nxt)[1].reused_tokens == len(convs[1]) + len(outs[1]) - 1


def test_keystroke_branches_are_evicted_before_a_long_conversation():
    """An editor's completions each branch off the last one near its end: under a small
    budget they push out one another (each is a short prefill away from the next one), not
    the older, longer conversation beside them."""
    dec = decoder("llama")
    conversation = [(5 * i + 2) % 90 + 1 for i in range(120)]
    code = [(11 * i + 7) % 90 + 1 for i in range(60)]
    probe = PromptCache(dec, 1 << 30)
    run(dec, probe, conversation)
    cache = PromptCache(dec, 2 * probe.stats().nbytes)  # the conversation and a few more
    run(dec, cache, conversation)
    for k in range(8):  # each keystroke re-tokenizes the last word: it branches off
        run(dec, cache, code + [70 + k, 40 + k])
    st = cache.stats()
    assert st.evictions >= 1 and st.nbytes <= cache.max_bytes
    out, ev, _ = run(dec, cache, conversation + [33])
    assert ev.reused_tokens == len(conversation) and out == cold(dec, conversation + [33])
    out, ev, _ = run(dec, cache, code + [77, 47])  # the last keystroke's branch serves on
    assert ev.reused_tokens >= len(code) and out == cold(dec, code + [77, 47])


@pytest.mark.parametrize("family", ["qwen3_5", "llama"])
def test_conversations_sharing_a_system_prompt_resume_at_their_branch_point(family, monkeypatch):
    """A recurrent state cannot roll back, so a hybrid target's conversations that shared a
    long system prompt (an agent's, with its tools) each prefilled it all again: where a
    prompt branches off a stored one far enough past what it is served, the state there is
    kept on the way, and the next branch resumes at it. Attention caches trim: no copies."""
    from dflash2_mlx.engine import prompt_cache

    monkeypatch.setattr(prompt_cache, "BRANCH_MIN_TOKENS", 16)
    dec = decoder(family, prefill_chunk=8)
    system = [(7 * i + 3) % 90 + 1 for i in range(40)]
    cache = PromptCache(dec, 1 << 30)
    convs = [system + [60 + k, 61, 62 + k] for k in range(4)]
    out, ev, _ = run(dec, cache, convs[0])
    assert ev.reused_tokens == 0 and out == cold(dec, convs[0])
    entries = cache.stats().entries
    out, ev, lease = run(dec, cache, convs[1])  # branches at the system prompt's end
    assert out == cold(dec, convs[1])
    if cache.trimmable:
        assert ev.reused_tokens == len(system) and lease.session.branch_points == ()
        assert cache.stats().entries == entries + 1  # its own: no branch copy
        return
    assert ev.reused_tokens == 0 and cache.stats().entries == entries + 3  # + the branch's
    for conv in convs[2:]:
        out, ev, _ = run(dec, cache, conv)
        assert ev.reused_tokens == len(system) and out == cold(dec, conv)
    # a branch's own next turn resumes at its prompt's last token
    nxt = convs[3] + out + [5, 6]
    out, ev, _ = run(dec, cache, nxt)
    assert ev.reused_tokens >= len(convs[3]) - 1 and out == cold(dec, nxt)
    short = system[:10] + [70, 71]  # too short a branch to keep a state for
    with cache.lease(short) as lease:
        assert lease.session.branch_points == ()


def test_leases_in_flight_together_do_not_interfere(dec):
    """With turn 1 stored: a branch off its prompt (gets a copy), its next turn (takes the
    entry, or a copy for hybrid) and the same next turn again (the entry is out: another
    source or cold) run interleaved round by round; each equals its cold run."""
    cache = PromptCache(dec, 1 << 30)
    out1, _, _ = run(dec, cache, TURN1)
    prompts = [TURN1[:5] + [70, 71, 72], TURN1 + out1 + [40, 41], TURN1 + out1 + [40, 41]]
    leases = [cache.lease(p) for p in prompts]
    assert len({id(lease.session) for lease in leases}) == 3
    assert leases[0].served == (5 if cache.trimmable else 0)  # hybrid: no state stored there
    assert leases[1].served == len(TURN1) + len(out1) - 1
    streams = [dec.stream(p, PARAMS, lease.session) for p, lease in zip(prompts, leases)]
    outs = [[] for _ in prompts]
    live = set(range(len(prompts)))
    while live:
        for i in sorted(live):
            ev = next(streams[i], None)
            if ev is None:
                live.discard(i)
                continue
            leases[i].observe(ev)
            outs[i] += ev.tokens
    for lease in leases:
        lease.close()
    for prompt, out in zip(prompts, outs):
        assert out == cold(dec, prompt), prompt
    # What came back serves the next turn exactly.
    nxt = prompts[1] + outs[1] + [50]
    out, ev, _ = run(dec, cache, nxt)
    assert ev.reused_tokens == len(prompts[1]) + len(outs[1]) - 1 and out == cold(dec, nxt)


def test_threads_never_lease_the_same_session():
    dec = decoder("llama")
    cache = PromptCache(dec, 1 << 30)
    out1, _, _ = run(dec, cache, TURN1)
    before = cache.stats().nbytes
    prompt, n = TURN1 + out1 + [40], 6
    barrier, got = threading.Barrier(n), []

    def worker():
        barrier.wait()
        got.append(cache.lease(prompt))

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == n and len({id(lease.session) for lease in got}) == n
    assert sorted(lease.served > 0 for lease in got) == [False] * (n - 1) + [True]
    want = cold(dec, prompt)
    for lease in got:  # the generations themselves run one at a time, as in the server
        with lease:
            events = [lease.observe(ev) or ev for ev in dec.stream(prompt, PARAMS, lease.session)]
        assert [t for ev in events for t in ev.tokens] == want
        assert events[0].reused_tokens == lease.served
    # Equal states replace each other: one entry, the size of one conversation.
    assert cache.stats().entries == 1 and cache.stats().nbytes < 2 * before


def test_an_interrupted_generation_is_not_kept(monkeypatch):
    """A round stopped midway, or a prefill stopped after extending the caches: the session
    is not consistent and is not stored; the next request is still exact."""
    dec = decoder("llama")
    cache = PromptCache(dec, 1 << 30)
    lease = cache.lease(TURN1)
    stream = dec.stream(TURN1, PARAMS, lease.session)
    lease.observe(next(stream))
    lease.session.in_round = True  # as after an exception inside a round
    stream.close()
    lease.close()
    assert cache.stats().entries == 0
    out1, _, _ = run(dec, cache, TURN1)
    real = dec.target.forward

    def forward_then_fail(*args, **kw):  # the prefill's first chunk extends the caches
        real(*args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(dec.target, "forward", forward_then_fail)  # this instance only
    turn2 = TURN1 + out1 + [40, 41]
    with pytest.raises(KeyboardInterrupt), cache.lease(turn2) as lease:
        assert lease.served > 0
        for ev in dec.stream(turn2, PARAMS, lease.session):
            lease.observe(ev)
    assert cache.stats().entries == 0
    monkeypatch.undo()
    out2, ev, _ = run(dec, cache, turn2)
    assert ev.reused_tokens == 0 and out2 == cold(dec, turn2)
    assert session_nbytes(dec.new_session()) == 0


def test_a_request_refused_before_its_prefill_keeps_the_conversation():
    """The entry a next turn takes goes back when the request fails before its prefill (a
    bad parameter): the turn after it still resumes the conversation."""
    dec = decoder("llama")
    cache = PromptCache(dec, 1 << 30)
    out1, _, _ = run(dec, cache, TURN1)
    turn2 = TURN1 + out1 + [40, 41]
    with cache.lease(turn2) as lease:
        with pytest.raises(ParameterError, match="block_size"):
            next(dec.stream(turn2, GenerationParams(max_tokens=4, block_size=99), lease.session))
    assert cache.stats().entries == 1
    out2, ev, _ = run(dec, cache, turn2)
    assert ev.reused_tokens == len(TURN1) + len(out1) - 1 and out2 == cold(dec, turn2)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_prefill_cancelled_midway_keeps_the_prefix_it_reused(family):
    """Cancelled between its chunks (Ctrl-C, a client gone), a prefill keeps the chunks it
    fed where every cache trims, else gives them back (Gated-DeltaNet state restored): the
    session holds the conversation and the next prompt reuses what it shares, exactly."""
    dec = decoder(family, prefill_chunk=4)
    session = dec.new_session()
    out1 = [t for ev in dec.stream(TURN1, PARAMS, session) for t in ev.tokens]
    held = len(TURN1) + len(out1) - 1  # what the session's caches hold after turn one
    turn2 = TURN1 + out1 + list(range(40, 50))  # 10 new tokens: three chunks of 4
    polls = []  # polled before the prefill, then before each chunk but the first
    cancel = lambda: polls.append(1) or len(polls) > 1  # noqa: E731
    cancelled = list(dec.stream(turn2, PARAMS, session, cancel=cancel))
    assert cancelled == [] and len(polls) == 2  # stopped before its second chunk
    turn3 = TURN1 + out1 + [40, 41, 7]  # the chunk fed: out1[-1], 40, 41, 42
    events = list(dec.stream(turn3, PARAMS, session))
    assert [t for ev in events for t in ev.tokens] == cold(dec, turn3)
    assert events[0].reused_tokens == held + (3 if family == "llama" else 0)


def test_cancel_is_polled_before_the_prefill_and_between_rounds():
    """True before the prefill: no event, the session untouched; true after the first
    event: the stream ends there and the session goes on exactly."""
    dec = decoder("llama")
    session = dec.new_session()
    assert list(dec.stream(TURN1, PARAMS, session, cancel=lambda: True)) == []
    assert session.tokens == []
    events = []
    stream = dec.stream(TURN1, PARAMS, session, cancel=lambda: len(events) >= 1)
    for ev in stream:
        events.append(ev)
    assert len(events) == 1 and events[0].prefill and not session.in_round
    nxt = TURN1 + events[0].tokens + [40, 41]
    out = [t for ev in dec.stream(nxt, PARAMS, session) for t in ev.tokens]
    assert out == cold(dec, nxt)


@pytest.mark.parametrize("kept", [None, 4])
def test_a_request_cancelled_mid_prefill_keeps_the_conversation(kept):
    """A client gone during its prompt's prefill: the entry it took goes back to the cache
    with the chunk it fed, so its retry prefills only the rest — also when the prompt
    re-rendered the answer differently (`kept` of its tokens: the lease trimmed the entry
    it took, the usual next turn)."""
    dec = decoder("llama", prefill_chunk=4)
    cache = PromptCache(dec, 1 << 30)
    out1, _, _ = run(dec, cache, TURN1)
    turn2 = TURN1 + out1[:kept] + list(range(40, 50))
    polls = []
    cancel = lambda: polls.append(1) or len(polls) > 1  # noqa: E731  (before the 2nd chunk)
    with cache.lease(turn2) as lease:
        assert lease.served > 0
        assert list(dec.stream(turn2, PARAMS, lease.session, cancel=cancel)) == []
    assert cache.stats().entries == 1
    out2, ev, _ = run(dec, cache, turn2)
    held = len(TURN1) + (len(out1) - 1 if kept is None else kept)
    assert ev.reused_tokens == held + 4 and out2 == cold(dec, turn2)  # and its first chunk


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_new_prompt_cancelled_mid_prefill_leaves_the_chunks_it_fed(family):
    """An editor's keystroke request abandoned during a long file's first prefill: the
    chunks it fed are stored (every cache trims), so the next keystroke's prompt prefills
    only the rest instead of the whole file again; a recurrent state holding part of a
    prompt is not kept (it could serve only prompts extending it, and is rolled back)."""
    dec = decoder(family, prefill_chunk=4)
    cache = PromptCache(dec, 1 << 30)
    prompt = list(range(3, 23))  # 20 tokens: five chunks of 4
    polls = []
    cancel = lambda: polls.append(1) or len(polls) > 2  # noqa: E731  (before the 3rd chunk)
    with cache.lease(prompt) as lease:
        assert lease.served == 0
        assert list(dec.stream(prompt, PARAMS, lease.session, cancel=cancel)) == []
    trims = family == "llama"
    assert cache.stats().entries == (1 if trims else 0)
    keystroke = prompt + [40]
    out, ev, _ = run(dec, cache, keystroke)
    assert ev.reused_tokens == (8 if trims else 0) and out == cold(dec, keystroke)


def test_an_untouched_copy_never_replaces_the_conversation_it_was_copied_from():
    """A request that branches off inside a stored conversation gets a copy; refused or
    gone before its prefill began, that copy is not stored (it held all of the conversation
    under the other request's prompt length and replaced it: the conversation's own next
    turn then found it cut back)."""
    dec = decoder("llama")  # attention: a prefix shared inside it is served
    cache = PromptCache(dec, 1 << 30)
    conv = list(range(3, 23))
    out, _, _ = run(dec, cache, conv)
    before = [(e.prompt_len, e.fed) for e in cache._entries.values()]
    lease = cache.lease(conv[:6] + [50, 51])  # shares 6 tokens: a copy
    assert lease.served == 6 and lease._taken is None
    lease.close()
    assert [(e.prompt_len, e.fed) for e in cache._entries.values()] == before
    turn2 = conv + out + [70, 71]
    out2, ev, _ = run(dec, cache, turn2)
    assert ev.reused_tokens == len(conv) + len(out) - 1 and out2 == cold(dec, turn2)


def test_a_second_stream_on_a_session_is_refused_even_before_the_first_starts(dec):
    session = dec.new_session()
    first = dec.stream(TURN1, PARAMS, session)
    with pytest.raises(ParameterError, match="in use"):
        dec.stream([40, 41, 42], PARAMS, session)
    assert [t for ev in first for t in ev.tokens] == cold(dec, TURN1)
    del first  # a stream dropped unstarted frees its session
    unstarted = dec.stream([40, 41, 42], PARAMS, session)
    del unstarted
    assert dec.generate([40, 41, 42], PARAMS, session) == cold(dec, [40, 41, 42])


def test_a_processor_that_fails_on_the_first_token_leaves_the_session_to_be_cleared(dec):
    session = dec.new_session()
    out1 = dec.generate(TURN1, PARAMS, session)

    def boom(tokens, logits):
        raise ValueError("processor failed")

    turn2 = TURN1 + out1 + list(range(40, 50))
    with pytest.raises(ValueError, match="processor failed"):
        list(dec.stream(turn2, replace(PARAMS, logits_processors=(boom,)), session))
    assert session.in_round  # not consistent: its caches hold the prompt, its tokens do not
    turn3 = TURN1 + out1 + [40, 41, 7]
    assert dec.generate(turn3, PARAMS, session) == cold(dec, turn3)


def test_a_short_conversation_is_kept_at_its_size_and_continues_exactly():
    """mlx-lm allocates KV rows 256 at a time: a 20-token conversation kept whole would
    count (and hold) 256 rows a layer. The stored entry holds its rows alone."""
    from mlx_lm.models.cache import KVCache

    dec = decoder("llama")
    cache = PromptCache(dec, 1 << 30)
    out1, _, _ = run(dec, cache, TURN1)
    turn2 = TURN1 + out1 + [40, 41]
    with cache.lease(turn2) as lease:  # the entry itself: it continues the conversation
        kv = [c for c in lease.session.target_cache if type(c) is KVCache]
        assert kv and all(c.keys.shape[2] == c.offset == lease.served for c in kv)
        assert cache.stats().nbytes == 0  # leased: out of the cache
        per_row = sum(c.keys.nbytes + c.values.nbytes for c in kv) // lease.served
    out2, ev, _ = run(dec, cache, turn2)
    assert out2 == cold(dec, turn2) and ev.reused_tokens == len(TURN1) + len(out1) - 1
    stored = cache.stats().nbytes
    assert stored < per_row * (len(turn2) + len(out2) + 64)  # not a 256-row allocation
