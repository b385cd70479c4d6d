"""The autotuned block by context length: the schedule is the expected-throughput argmax at
every context (costs linear in the context through two measurements), the autotuner stores
it, the settings hand it to the front ends with the profile's block only, and the engine
switches blocks at its contexts with the output unchanged (single and batched)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import tiny

import dflash2_mlx as d2
from dflash2_mlx import autotune as A
from dflash2_mlx import costs
from dflash2_mlx.block_schedule import STEP, block_schedule, costs_at, long_context, monotone
from dflash2_mlx.errors import DFlash2Error, ParameterError
from dflash2_mlx.registry import ResolvedPair
from dflash2_mlx.settings import BY_PROFILE, BlockChoice, Drafting, EngineFlags, resolve_engine

pytestmark = pytest.mark.usefixtures("dflash2_home")  # profiles go to a private cache

SHORT_V = {1: 10.0, 2: 11.0, 3: 12.0, 4: 12.5}
LONG_V = {1: 20.0, 2: 26.0, 3: 33.0, 4: 41.0}
SHORT_D = {1: 0.0, 2: 1.0, 3: 1.2, 4: 1.4}
LONG_D = {1: 0.0, 2: 2.0, 3: 2.6, 4: 3.2}
PROBS = [0.6, 0.5, 0.5]


@pytest.fixture(scope="module")
def pair():
    return d2.Pair.from_models(tiny.make_target("llama", seed=3), None, tiny.make_drafter(2, 4))


def test_costs_are_linear_in_the_context_through_the_two_measurements():
    short, long = (256, {1: 10.0, 2: 12.0}), (2048, {1: 20.0, 2: 30.0, 3: 40.0})
    assert costs_at(256, short, long) == {1: 10.0, 2: 12.0}  # widths measured at both only
    assert costs_at(2048, short, long) == {1: 20.0, 2: 30.0}
    assert costs_at(1152, short, long) == {1: 15.0, 2: 21.0}
    assert costs_at(3840, short, long) == {1: 30.0, 2: 48.0}  # beyond: along the same line
    assert long_context(256, 8192) == 2048 and long_context(256, 1000) is None


def test_the_schedule_is_the_best_block_at_every_context():
    def best(v, d):
        return A.choose_block(v, d, PROBS, max_block=4).block

    until = 8192
    first = best(SHORT_V, SHORT_D)
    schedule = block_schedule(
        ((256, SHORT_V), (2048, LONG_V)), ((256, SHORT_D), (2048, LONG_D)), best, until, first
    )
    assert schedule and [b for _, b in schedule] == sorted((b for _, b in schedule), reverse=True)

    def scheduled(context):
        block = first
        for start, b in schedule:
            if context >= start:
                block = b
        return block

    for context in range(256, until + 1, STEP):  # the formula, evaluated independently
        t = (context - 256) / (2048 - 256)
        v = {w: SHORT_V[w] + (LONG_V[w] - SHORT_V[w]) * t for w in SHORT_V}
        d = {b: SHORT_D[b] + (LONG_D[b] - SHORT_D[b]) * t for b in SHORT_D}

        def tps(b):
            e = 1.0 + sum(math.prod(PROBS[:k]) for k in range(1, b))
            return e / (v[b] + (d[b] if b > 1 else 0.0))

        assert scheduled(context) == max(range(1, 5), key=lambda b: (tps(b), -b)), context


def test_noise_cannot_make_the_block_rise_with_the_context():
    """Timing noise (a wider verify measured cheaper, a width cheaper at the longer context)
    is evened out, and the schedule only ever lowers the block, from the one chosen."""
    noisy_long = {1: 20.0, 2: 26.0, 3: 45.0, 4: 30.0}  # 4 "cheaper" than 3
    assert monotone((256, SHORT_V), (2048, noisy_long))[1][1] == {1: 20, 2: 26, 3: 45, 4: 45}
    assert monotone((256, {1: 10.0, 2: 9.0}), (2048, {1: 8.0, 2: 30.0})) == (
        (256, {1: 10.0, 2: 10.0}),
        (2048, {1: 10.0, 2: 30.0}),
    )

    def best(v, d):
        return A.choose_block(v, d, PROBS, max_block=4).block

    for first in (4, 3):
        schedule = block_schedule(
            ((256, SHORT_V), (2048, noisy_long)),
            ((256, SHORT_D), (2048, LONG_D)),
            best,
            8192,
            first,
        )
        blocks = [first] + [b for _, b in schedule]
        assert all(a > b for a, b in zip(blocks, blocks[1:])), schedule


def test_a_wider_block_whose_cost_grows_slower_is_held_at_the_chosen_one():
    """Costs can be monotone and still make a wider block win at a longer context (its cost
    grew less with the context than a narrower one's): the schedule never raises the block."""
    short, long = {1: 10.0, 2: 14.0, 3: 17.0, 4: 20.0}, {1: 30.0, 2: 30.0, 3: 30.0, 4: 30.0}
    flat = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}

    def best(v, d):
        return A.choose_block(v, d, [0.5, 0.5, 0.5], max_block=4).block

    assert best(short, flat) == 2 and best(long, flat) == 4  # unguarded, it would rise
    assert (
        block_schedule(((256, short), (2048, long)), ((256, flat), (2048, flat)), best, 8192, 2)
        == []
    )


def _context_costs(monkeypatch):
    """Fake measurements whose verify and draft costs grow with the context they run at."""
    monkeypatch.setattr(
        costs,
        "verify_costs",
        lambda pair, widths, context=256, **kw: {
            "context": context,
            "repeats": 1,
            "ms": {w: 10.0 + w * context / 256 for w in widths},
            "ratio": {w: 1.0 for w in widths},
        },
    )
    monkeypatch.setattr(
        costs,
        "draft_costs",
        lambda pair, blocks, context=256, **kw: {
            "context": context,
            "repeats": 1,
            "feature_rows": 2,
            "ms": {b: 0.0 if b == 1 else 1.0 for b in blocks},
        },
    )
    monkeypatch.setattr(
        A,
        "calibrate",
        lambda pair, prompts, block, **kw: {
            "block": block,
            "rounds": 100,
            "position_probs": [0.9] * (block - 1),
            "lookup_counts": [],
            "lookup_block": kw.get("lookup_block"),
        },
    )


def test_a_server_starts_with_a_profile_whose_block_never_falls_and_with_block(pair, monkeypatch):
    """A profile measured at a long context stores a verify cost even where the block never
    falls (no schedule), and --block drops the schedule: create_app refused both ("verify_cost
    applies from block_by_context's first context on"), so `dflash2 serve` did not start."""
    from dflash2_mlx.serve import create_app
    from test_serve import make_tokenizer

    _context_costs(monkeypatch)
    profile = A.autotune(pair, [], target="org/t", drafter="org/d", max_block=4, batches=())
    A.save_profile({**profile, "block_by_context": []})
    served = d2.Pair.from_models(pair.model, make_tokenizer(), pair.drafter)
    for flags in (EngineFlags(), EngineFlags(block=2)):
        s = resolve_engine(flags, served, ResolvedPair("org/t", "org/d"), None)
        assert s.verify_cost is not None and s.block.by_context == ()
        assert s.drafting.verify_cost is None  # nothing to apply it from
        app = create_app(served, model_name="m", drafting=s.drafting)
        assert app.state.settings.drafting.block == s.block.size


def test_the_autotuner_stores_the_schedule_and_the_settings_use_it_with_its_block(
    pair, monkeypatch
):
    _context_costs(monkeypatch)
    profile = A.autotune(pair, [], target="org/t", drafter="org/d", max_block=4, batches=())
    assert profile["long_context"]["context"] == 2048  # the tiny target's context: 4096
    schedule = profile["block_by_context"]
    assert schedule == profile["long_context"]["block_by_context"]
    assert schedule and schedule[0][0] > 256 and schedule[-1][1] < profile["chosen_block"]
    A.save_profile(profile)
    resolved = ResolvedPair("org/t", "org/d")
    s = resolve_engine(EngineFlags(), pair, resolved, None)
    assert s.block.by_context == s.auto_block.by_context == tuple(map(tuple, schedule))
    c, b = schedule[0]
    assert f"; {b} from {c:,}" in s.block.describe()  # said at start (chat, serve)
    long = profile["long_context"]  # one sequence's verify cost at both measured contexts
    ms = {int(w): v for w, v in long["verify_ms"].items()}
    assert s.verify_cost(long["context"], 2) == pytest.approx(ms[2])
    s = resolve_engine(EngineFlags(block=2), pair, resolved, None)  # --block: that block alone
    assert s.block.by_context == () and s.auto_block.by_context == tuple(map(tuple, schedule))
    # a stored schedule that does not fall from the chosen block within the trained size: none
    trained = pair.drafter.config.block_size
    for bad in ([[300, 2], [600, 3]], [[300, profile["chosen_block"]]], [[300, trained + 1]]):
        A.save_profile({**profile, "block_by_context": bad})
        assert resolve_engine(EngineFlags(), pair, resolved, None).block.by_context == ()


@pytest.mark.parametrize(
    "schedule, message",
    [
        (((10, 2), (10, 3)), "strictly ascending"),
        (((10, 0),), "is not a context \\(int >= 1\\) and a block >= 1"),
        ((("10", 2),), "is not a context \\(int >= 1\\)"),
        ((5,), "must be \\(context, block\\) pairs"),
    ],
)
def test_bad_schedules_are_refused(schedule, message):
    with pytest.raises(ParameterError, match=message):
        d2.GenerationParams(block_by_context=schedule)


def test_a_schedule_past_the_trained_block_or_without_speculation_is_refused(pair):
    past = pair.drafter.config.block_size + 1
    with pytest.raises(ParameterError, match=f"block_by_context: block {past} exceeds"):
        pair.generate([1, 2, 3], d2.GenerationParams(max_tokens=4, block_by_context=((4, past),)))
    with pytest.raises(ParameterError, match="block_by_context has no effect"):
        d2.GenerationParams(speculative=False, block_by_context=((4, 2),))


def test_the_engine_switches_blocks_at_the_schedules_contexts_output_unchanged(pair):
    prompt = list(range(5, 25))
    plain = pair.generate(prompt, d2.GenerationParams(max_tokens=40, speculative=False))[0]
    at = len(prompt) + 12
    # backoff=False: every drafter round drafts its block (this random drafter backs off)
    params = d2.GenerationParams(
        max_tokens=40, block_size=4, block_by_context=((at, 2),), backoff=False
    )
    prompts = [prompt, prompt[:12]]
    # batched: every width costs the same, so the width rule cuts no proposal
    single = [(0, ev) for ev in pair.stream(prompt, params)]
    for events, outputs in (
        (single, [plain]),
        (
            list(pair.stream_batch(prompts, params, 2, lambda rows, width: 1.0)),
            [plain, pair.generate(prompts[1], params)[0]],
        ),
    ):
        context = {i: len(p) for i, p in enumerate(prompts)}
        blocks, out = [], {i: [] for i in range(len(outputs))}
        for i, ev in events:
            room = len(prompts[i]) + 40 - context[i]
            if not ev.prefill and ev.source == "drafter" and room >= 4:  # not cut by max_tokens
                blocks.append((context[i], ev.block_size))
            context[i] += len(ev.tokens)
            out[i] += ev.tokens
        assert [out[i] for i in range(len(outputs))] == outputs
        assert {b for c, b in blocks if c >= at} == {2}
        assert {b for c, b in blocks if c < at} == {4}


def test_the_server_runs_its_requests_with_the_schedule_and_shows_it():
    import openai
    from test_serve import make_tokenizer, running

    from dflash2_mlx.serve import create_app

    pair = d2.Pair.from_models(
        tiny.make_target("llama", seed=3), make_tokenizer(), tiny.make_drafter(2, 4)
    )
    with pytest.raises(DFlash2Error, match="the pair has no tokenizer"):
        create_app(d2.Pair.from_models(pair.model, None, pair.drafter), model_name="m")
    with pytest.raises(ParameterError, match="block_size must be 1 .. "):
        create_app(pair, model_name="m", drafting=Drafting(by_context=((30, 99),)))
    schedule = ((30, 2), (60, 1))
    steep = lambda context, width: 1.0 + width  # noqa: E731 - each token as dear as a forward
    app = create_app(
        pair,
        model_name="m",
        default_max_tokens=40,
        drafting=Drafting(by_context=schedule, verify_cost=steep),
    )
    prompt = list(range(5, 25))
    with running(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        assert client.models.list().data[0].model_extra["dflash2"]["block_by_context"] == [
            [30, 2],
            [60, 1],
        ]
        long = client.completions.create(
            model="m", prompt=list(range(5, 45)), max_tokens=4, temperature=0
        )
        r = client.completions.create(model="m", prompt=prompt, max_tokens=40, temperature=0)
        repeats = list(range(5, 17)) * 3  # its lookup proposals are cut past 30 tokens
        cut = client.completions.create(model="m", prompt=repeats, max_tokens=40, temperature=0)
    # usage says the block at the reply's start: the trained one for 20 prompt tokens, 2 for 40
    assert r.usage.model_extra["dflash2"]["block_size"] == pair.drafter.config.block_size
    assert long.usage.model_extra["dflash2"]["block_size"] == 2
    params = d2.GenerationParams(max_tokens=40, block_by_context=schedule)
    expected = pair.generate(prompt, params)
    assert r.choices[0].text == pair.tokenizer.decode(expected[0])
    # the schedule reached the engine: the server drafted as the scheduled run (block 2 from
    # 30 tokens on), not as the unscheduled one (its rounds may match: this random drafter is
    # accepted about never, and backs off)
    drafted = r.usage.model_extra["dflash2"]["drafted"]
    assert (
        drafted
        == expected[1].drafted
        != pair.generate(prompt, replace(params, block_by_context=()))[1].drafted
    )
    # so did the verify cost: its lookup proposals were cut as the engine cuts them
    want, stats = pair.generate(repeats, replace(params, verify_cost=steep))
    assert cut.choices[0].text == pair.tokenizer.decode(want)
    assert cut.usage.model_extra["dflash2"]["rounds"] == stats.rounds
    assert stats.rounds != pair.generate(repeats, params)[1].rounds


def test_the_chats_status_line_shows_the_block_at_the_conversations_length():
    """The block falls with the context; the live status says the one the rounds use."""
    from types import SimpleNamespace

    from dflash2_cli.chat_repl import Chat
    from dflash2_mlx.engine.generation import block_at

    schedule = ((1536, 2), (6656, 1))
    assert [block_at(4, schedule, n) for n in (0, 1535, 1536, 6655, 6656, 10**6)] == [
        4,
        4,
        2,
        2,
        1,
        1,
    ]
    assert block_at(4, (), 10**6) == 4
    stats = d2.GenerationStats()
    for tokens, spec, temperature, shown in (
        (100, True, 0.0, "block 4"),
        (2000, True, 0.0, "block 2"),
        (7000, True, 0.0, "block 1"),
        (2000, False, 0.0, "spec off"),
        (100, True, 0.9, "block 4"),  # the profile's block_by_temperature: 3 from 1.0
        (100, True, 1.0, "block 3"),
        (2000, True, 1.5, "block 2"),  # the context's schedule below it still applies
    ):
        chat = SimpleNamespace(
            block=BlockChoice(4, 8, BY_PROFILE, None, schedule, ((1.0, 3),)),
            sampling=d2.SamplingParams(temperature=temperature),
            spec=spec,
            session=SimpleNamespace(tokens=[0] * tokens),
            engine=SimpleNamespace(lookup_block=None, verify_cost=None),
        )
        chat.drafting = lambda chat=chat: Chat.drafting(chat)
        chat.block_now = lambda chat=chat: Chat.block_now(chat)
        assert shown in Chat.status(chat, stats).plain, (tokens, spec, temperature)
    settings = SimpleNamespace(  # /stats lists the schedule beside the block
        sampling=d2.SamplingParams(),
        max_tokens=5,
        block=BlockChoice(4, 8, BY_PROFILE, None, schedule, ((1.0, 3),)),
        trained=8,
        spec=True,
        pair=SimpleNamespace(decoder=SimpleNamespace(lookup=3), tokenizer=None),
        thinking=None,
        thinking_budget=None,
        repetition_penalty=None,
        system=None,
    )
    block = Chat.settings(settings)["block"]
    assert block == (
        "4 (trained 8); 2 from 1,536 tokens; 1 from 6,656 tokens; 3 from temperature 1"
    )
    by_flag = SimpleNamespace(**{**vars(settings), "block": BlockChoice(3, 8, "/block")})
    assert Chat.settings(by_flag)["block"] == "3 (trained 8)"  # /block 3: nothing falls
