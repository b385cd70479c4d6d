"""The autotuned block for sampled requests: the autotuner calibrates sampled rounds at
calibration.SAMPLED_TEMPERATURES, stores the blocks that fall below the greedy choice, the
settings hand them to the front ends with the profile's block only, and a request at such a
temperature runs (and reports) the smaller block — through the server and the chat alike."""

from __future__ import annotations

import pytest
import tiny
from test_block_schedule import _context_costs
from tiny_pair import save_pair

import dflash2_mlx as d2
from dflash2_mlx import autotune as A
from dflash2_mlx.calibration import SAMPLED_TEMPERATURES, calibrate, falling_blocks
from dflash2_mlx.errors import DFlash2Error, ParameterError
from dflash2_mlx.engine.generation import check_block_by_temperature
from dflash2_mlx.prompts import load_prompts
from dflash2_mlx.registry import ResolvedPair
from dflash2_mlx.settings import (
    Drafting,
    EngineFlags,
    SamplingDefaults,
    block_for_temperature,
    resolve_engine,
)

pytestmark = pytest.mark.usefixtures("dflash2_home")  # profiles go to a private cache


def test_falling_blocks_lists_only_where_the_block_falls():
    assert falling_blocks([(0.7, 4), (1.0, 2)], 4) == [[1.0, 2]]
    assert falling_blocks([(1.0, 2), (0.7, 3)], 4) == [[0.7, 3], [1.0, 2]]  # sorted
    assert falling_blocks([(0.7, 2), (1.0, 3)], 4) == [[0.7, 2]]  # a rise is noise: held
    assert falling_blocks([(0.7, 4), (1.0, 5)], 4) == []
    assert falling_blocks([], 4) == []


def test_the_block_at_a_temperature_and_the_context_schedule_below_it():
    by_context = ((1536, 2), (6656, 1))
    by_temperature = ((0.7, 3), (1.0, 2))
    blocks = [
        block_for_temperature(4, by_context, by_temperature, t)
        for t in (0.0, 0.69, 0.7, 0.99, 1.0, 2.0)
    ]
    assert blocks == [(4, by_context)] * 2 + [(3, by_context)] * 2 + [(2, ((6656, 1),))] * 2
    assert block_for_temperature(4, by_context, (), 1.5) == (4, by_context)
    assert block_for_temperature(2, (), ((1.0, 3),), 1.5) == (2, ())  # never above the block
    # the context schedule is left as given where the temperature lowers nothing
    assert block_for_temperature(2, ((10, 3),), ((1.0, 1),), 0.0) == (2, ((10, 3),))


def test_the_chat_builds_each_turns_params_at_its_temperature():
    from types import SimpleNamespace

    from dflash2_cli.chat_repl import Chat
    from dflash2_mlx.settings import BY_PROFILE, BlockChoice

    chat = SimpleNamespace(
        block=BlockChoice(4, 8, BY_PROFILE, None, ((1536, 2),), ((1.0, 3),)),
        thinking_budget=None,
        max_tokens=16,
        spec=True,
        engine=SimpleNamespace(lookup_block=12, verify_cost=max),
        processors=(),
    )
    chat.drafting = lambda: Chat.drafting(chat)
    for temperature, block, by_context in ((0.0, 4, ((1536, 2),)), (1.2, 3, ((1536, 2),))):
        chat.sampling = d2.SamplingParams(temperature=temperature)
        params = Chat.params(chat)
        assert (params.block_size, params.block_by_context) == (block, by_context)
        assert params.verify_cost is max  # the profile's, with its schedule
    chat.block = BlockChoice(4, 8, "/block")  # /block 4: nothing falls, nothing is cut
    assert Chat.params(chat).block_size == 4 and Chat.params(chat).verify_cost is None


@pytest.mark.parametrize(
    "pairs, message",
    [
        ([(0, 2)], "not a temperature \\(number > 0\\)"),
        ([(1.0, 0)], "block >= 1"),
        ([(True, 2)], "not a temperature \\(number > 0\\)"),
        ([(1.0, 2.5)], "block >= 1"),
        ([(1.0, 2), (0.7, 3)], "strictly ascending"),
        ("x", "must be \\(temperature, block\\) pairs"),
    ],
)
def test_bad_temperature_schedules_are_refused(pairs, message):
    with pytest.raises(ParameterError, match=message):
        check_block_by_temperature(pairs)


@pytest.fixture(scope="module")
def pair():
    return d2.Pair.from_models(tiny.make_target("llama", seed=3), None, tiny.make_drafter(2, 4))


def _fake_measurements(monkeypatch, hot_rounds=100):
    """Costs growing with the width; greedy rounds accept 90 % a draft (block 4 wins), rounds
    at T >= 1 only 5 % (block 1 wins) with `hot_rounds` drafter rounds, T 0.7 as greedy."""
    _context_costs(monkeypatch)

    def fake_calibrate(pair, prompts, block, temperature=0.0, **kw):
        hot = temperature >= 1.0
        return {
            "block": block,
            "temperature": temperature,
            "rounds": hot_rounds if hot else 100,
            "tau": 1.0,
            "position_probs": [0.05 if hot else 0.9] * (block - 1),
            "lookup_counts": [],
            "lookup_block": kw.get("lookup_block"),
        }

    monkeypatch.setattr(A, "calibrate", fake_calibrate)


def test_the_autotuner_calibrates_sampled_rounds_and_the_settings_use_their_block(
    pair, monkeypatch
):
    _fake_measurements(monkeypatch)
    profile = A.autotune(pair, [], target="org/t", drafter="org/d", max_block=4, batches=())
    assert [c["temperature"] for c in profile["sampled"]] == list(SAMPLED_TEMPERATURES)
    assert [c["chosen_block"] for c in profile["sampled"]] == [4, 1]
    assert profile["chosen_block"] == 4 and profile["block_by_temperature"] == [[1.0, 1]]
    A.save_profile(profile)
    resolved = ResolvedPair("org/t", "org/d")
    s = resolve_engine(EngineFlags(), pair, resolved, None)
    assert s.block.by_temperature == s.auto_block.by_temperature == ((1.0, 1),)
    assert s.block.describe().endswith("; 1 from temperature 1)")  # said at start
    assert s.drafting.at(0.9) == (4, s.block.by_context)
    assert s.drafting.at(1.0)[0] == 1
    s = resolve_engine(EngineFlags(block=2), pair, resolved, None)  # --block: that block alone
    assert s.block.by_temperature == () and s.auto_block.by_temperature == ((1.0, 1),)
    for bad in ([[1.0, 4]], [[1.0, 5]], [[1.0, 2], [0.7, 1]], "junk"):  # none that falls: none
        A.save_profile({**profile, "block_by_temperature": bad})
        assert resolve_engine(EngineFlags(), pair, resolved, None).block.by_temperature == ()


def test_a_temperature_with_too_few_drafter_rounds_chooses_nothing_and_says_why(pair, monkeypatch):
    _fake_measurements(monkeypatch, hot_rounds=3)
    profile = A.autotune(pair, [], target="org/t", drafter="org/d", max_block=4, batches=())
    hot = profile["sampled"][1]
    assert hot["temperature"] == 1.0 and hot["chosen_block"] is None
    assert hot["reason"] == "3 drafter rounds, fewer than 20"
    assert profile["block_by_temperature"] == []


def test_a_sampled_calibration_is_seeded_and_counts_drafter_rounds(tmp_path):
    t, d = save_pair(tmp_path / "pair")
    real = d2.load_pair(t, d)
    prompts = load_prompts("heldout")[:2]
    runs = [calibrate(real, prompts, 4, lookup_block=4, max_tokens=24, temperature=1.0)]
    runs.append(calibrate(real, prompts, 4, lookup_block=4, max_tokens=24, temperature=1.0))
    c = runs[0]
    assert c["temperature"] == 1.0 and c["rounds"] > 0 and len(c["position_probs"]) == 3
    assert runs[0] == runs[1]  # seed 0: the same draws each time
    assert c["rounds"] + c["lookup_rounds"] <= 2 * 23  # full rounds only, each >= 1 token


def test_the_server_runs_a_hot_request_at_its_block_and_reports_it():
    import openai
    from test_serve import make_tokenizer, running

    from dflash2_mlx.serve import create_app

    served = d2.Pair.from_models(  # no lookup: every round is a drafter round
        tiny.make_target("llama", seed=3), make_tokenizer(), tiny.make_drafter(2, 4), lookup=0
    )
    with pytest.raises(ParameterError, match="block_by_temperature must be 1 .. 16: 99 exceeds"):
        create_app(served, model_name="m", drafting=Drafting(by_temperature=((1.0, 99),)))
    with pytest.raises(ParameterError, match="block_by_temperature has no effect"):
        create_app(served, model_name="m", drafting=Drafting(False, by_temperature=((1.0, 2),)))
    with pytest.raises(DFlash2Error, match="strictly ascending"):
        create_app(served, model_name="m", drafting=Drafting(by_temperature=((1.0, 2), (0.5, 1))))
    with pytest.raises(ParameterError, match="the blocks must fall from the block \\(2\\)"):
        create_app(served, model_name="m", drafting=Drafting(block=2, by_temperature=((0.7, 3),)))
    app = create_app(
        served,
        model_name="m",
        default_max_tokens=30,
        drafting=Drafting(block=4, by_temperature=((1.0, 2),)),
    )
    prompt = list(range(5, 25))
    with running(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        card = client.models.list().data[0].model_extra["dflash2"]
        assert card["block_by_temperature"] == [[1.0, 2]] and card["block_size"] == 4
        used = {}
        for temperature in (0.5, 1.0, 1.3):
            r = client.completions.create(
                model="m", prompt=prompt, max_tokens=30, temperature=temperature, seed=7
            )
            used[temperature] = r.usage.model_extra["dflash2"]
    assert {t: u["block_size"] for t, u in used.items()} == {0.5: 4, 1.0: 2, 1.3: 2}
    # a server whose default temperature is 1.0: a request that gives none runs block 2
    hot = SamplingDefaults(d2.SamplingParams(temperature=1.0), (("temperature", "--temp"),))
    app = create_app(
        served, model_name="m", sampling=hot, drafting=Drafting(block=4, by_temperature=((1.0, 2),))
    )
    with running(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="m", prompt=prompt, max_tokens=20, seed=7)
        used["default"] = r.usage.model_extra["dflash2"]
        r = client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0)
        assert r.usage.model_extra["dflash2"]["block_size"] == 4
    assert used["default"]["block_size"] == 2
    # what the engine ran: a drafter round drafts its block's drafts (a last one may not),
    # until this random drafter, accepted about never, backs off (generation.BACKOFF_AFTER)
    from dflash2_mlx.engine.generation import BACKOFF_AFTER

    for temperature, u in used.items():
        drafts = u["block_size"] - 1
        assert u["rounds"] > 2 and drafts * min(u["rounds"] - 1, BACKOFF_AFTER) <= u["drafted"], u
        assert u["drafted"] <= drafts * u["rounds"], u


def test_the_chats_temp_command_says_when_the_block_changes():
    from types import SimpleNamespace

    from dflash2_cli.chat_repl import Chat
    from dflash2_mlx.settings import BY_PROFILE, BlockChoice

    said = []
    chat = SimpleNamespace(
        block=BlockChoice(4, 8, BY_PROFILE, None, (), ((1.0, 2),)),
        sampling=d2.SamplingParams(),
        spec=True,
        session=SimpleNamespace(tokens=[]),
        engine=SimpleNamespace(lookup_block=None, verify_cost=None),
        _say=lambda text, style="": said.append(text),
        warn_greedy_filters=lambda: None,
    )
    chat.drafting = lambda: Chat.drafting(chat)
    chat._number = lambda name, arg, kind: Chat._number(chat, name, arg, kind)
    chat.block_now = lambda: Chat.block_now(chat)
    for arg in ("0.5", "1", "1.5", "0"):
        Chat._set_sampling(chat, "/temp", arg)
    assert said == [
        "temperature = 0.5",
        "temperature = 1.0 (block 2)",
        "temperature = 1.5",
        "temperature = 0.0 (block 4)",
    ]
