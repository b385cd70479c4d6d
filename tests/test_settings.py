"""The engine-settings resolver every front end uses (dflash2_mlx.settings): the block rule
step by step with its reason and clamping, contradicting flags refused naming the flags, and
sampling defaults field by field (flag, then generation_config.json, then greedy)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import dflash2_mlx as d2
from dflash2_mlx import autotune as A
from dflash2_mlx.engine.lookup import DEFAULT_LOOKUP
from dflash2_mlx.sampling import SamplingParams
from dflash2_mlx.errors import ConfigError, ParameterError
from dflash2_mlx.registry import ResolvedPair
from dflash2_mlx.settings import (
    Drafting,
    BY_ALIAS,
    BY_FLAG,
    BY_PROFILE,
    BY_TRAINED,
    GENERATION_CONFIG,
    QUANTIZED_CPU,
    SAMPLING_FLAGS,
    EngineFlags,
    SamplingDefaults,
    check_block,
    choose_block,
    generation_config,
    idle_when_greedy,
    resolve_engine,
    resolve_sampling,
)
from tiny import make_drafter, make_target


# ------------------------------------------------------------------------------ block rule
def test_block_precedence_flag_profile_alias_trained():
    assert choose_block(8, flag=3, profile=6, alias=5) == choose_block(8, flag=3)
    c = choose_block(8, flag=3, profile=6, alias=5)
    assert (c.size, c.reason, c.note) == (3, BY_FLAG, None)
    c = choose_block(8, profile=6, alias=5)
    assert (c.size, c.reason) == (6, BY_PROFILE)
    c = choose_block(8, alias=5)
    assert (c.size, c.reason) == (5, BY_ALIAS)
    c = choose_block(8)
    assert (c.size, c.reason, c.trained) == (8, BY_TRAINED, 8)
    assert c.describe() == "block 8 (drafter's trained block, trained 8)"


def test_a_recommendation_above_the_trained_size_is_clamped_with_the_reason():
    c = choose_block(8, alias=16)
    assert (c.size, c.reason, c.clamped_from) == (8, BY_ALIAS, 16)
    assert c.note == (
        "the alias recommendation (block 16) exceeds the drafter's trained block size 8: using 8"
    )
    c = choose_block(4, profile=6, alias=2)  # the profile wins, clamped; the alias is not used
    assert (c.size, c.reason, c.clamped_from) == (4, BY_PROFILE, 6)


@pytest.mark.parametrize(
    "value, trained, flag, message",
    [
        (9, 8, "--block", "--block must be 1 .. 8: 9 exceeds the drafter's trained block size 8"),
        (99, 8, "/block", "/block must be 1 .. 8: 99 exceeds"),
        (0, 8, "--block", "--block: block_size must be an int >= 1, got 0"),
        (0, None, "block_size", "block_size: block_size must be an int >= 1"),
        (2.5, None, "--block", "must be an int >= 1, got 2.5"),
    ],
)
def test_a_block_above_the_trained_size_or_below_one_is_refused_naming_the_flag(
    value, trained, flag, message
):
    with pytest.raises(ParameterError) as err:
        check_block(value, trained, flag)
    assert message in str(err.value)
    with pytest.raises(ParameterError, match="--block must be 1 .. 8"):
        choose_block(8, flag=9, profile=4)  # an explicit block is never clamped


# ------------------------------------------------------------------------------ flags
@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(full_vocab=True, draft_vocab=20), "--draft-vocab and --full-vocab contradict"),
        (dict(block=0), "--block: block_size must be an int >= 1"),
        (dict(lookup=-1), "--lookup must be an int >= 0"),
        (dict(sampling={"temperature": -1.0}), "--temp: temperature must be a finite number >= 0"),
        (dict(sampling={"top_p": 1.01}), "--top-p: top_p must be in [0, 1]"),
        (dict(sampling={"top_k": -3}), "--top-k: top_k must be an int >= 0"),
        (dict(sampling={"min_p": 1.5}), "--min-p: min_p must be in [0, 1]"),
        (dict(sampling={"seed": -1}), "--seed: seed must be an int in [0, 2**64)"),
        (dict(sampling={"typical_p": 0.5}), "unknown sampling field 'typical_p'"),
        (dict(lookup=True), "--lookup must be an int >= 0, got True"),
        (dict(draft_vocab=True), "--draft-vocab must be an int >= 1, got True"),
        (dict(speculative="no"), "speculative must be True or False, got 'no'"),
        (dict(full_vocab=1), "full_vocab must be True or False, got 1"),
        (dict(sampling=[("temperature", 0.5)]), "sampling must be a mapping of field -> value"),
    ],
)
def test_contradicting_or_bad_flags_are_refused_naming_the_flag(kw, message):
    with pytest.raises(ParameterError) as err:
        EngineFlags(**kw)
    assert message in str(err.value)


def test_flags_defaults():
    f = EngineFlags()
    assert f.lookup_or_default == DEFAULT_LOOKUP and EngineFlags(lookup=0).lookup_or_default == 0
    EngineFlags(speculative=False, full_vocab=True, sampling={"temperature": None})  # fine


def test_every_sampling_parameter_has_a_flag():
    """Adding a SamplingParams field without a flag (and so without the resolver) fails here."""
    assert set(SAMPLING_FLAGS) == {f.name for f in dataclasses.fields(SamplingParams)}


# ------------------------------------------------------------------------------ sampling
def _config(folder, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / GENERATION_CONFIG).write_text(json.dumps(fields))
    return folder


def test_no_generation_config_means_greedy(tmp_path):
    for where in (None, tmp_path):
        d = resolve_sampling({}, where)
        assert d.params == SamplingParams() and d.params.greedy
        assert d.source("temperature") == "default" and d.describe() == "greedy (default)"
    _config(tmp_path, bos_token_id=1, eos_token_id=2)  # a config without sampling fields
    assert resolve_sampling({}, tmp_path).params == SamplingParams()


def test_generation_config_then_flags_field_by_field(tmp_path):
    folder = _config(
        tmp_path / "m", do_sample=True, temperature=0.6, top_p=0.95, top_k=20, eos_token_id=2
    )
    d = resolve_sampling({}, folder)
    assert d.params == SamplingParams(0.6, 0.95, 20, 0.0, None)
    assert d.source("top_k") == GENERATION_CONFIG and d.source("min_p") == "default"
    assert d.describe() == "temperature 0.6, top_p 0.95, top_k 20 (generation_config.json)"
    d = resolve_sampling({"temperature": 0.9, "min_p": 0.05, "seed": 3, "top_p": None}, folder)
    assert d.params == SamplingParams(0.9, 0.95, 20, 0.05, 3)
    assert [d.source(n) for n in SAMPLING_FLAGS] == [
        "--temp",
        GENERATION_CONFIG,
        GENERATION_CONFIG,
        "--min-p",
        "--seed",
    ]
    assert d.from_flags == ("temperature", "min_p", "seed")
    assert d.describe() == (
        "temperature 0.9 (--temp); top_p 0.95, top_k 20 "
        "(generation_config.json); min_p 0.05 (--min-p); seed 3 (--seed)"
    )
    card = d.to_json()
    assert card["temperature"] == 0.9 and card["top_k"] == 20
    assert card["source"] == {
        "temperature": "--temp",
        "top_p": GENERATION_CONFIG,
        "top_k": GENERATION_CONFIG,
        "min_p": "--min-p",
        "seed": "--seed",
    }


def test_do_sample_false_means_greedy_unless_a_flag_asks_for_sampling(tmp_path):
    folder = _config(tmp_path, do_sample=False, temperature=0.7, top_p=0.8)
    d = resolve_sampling({}, folder)
    assert d.params.greedy and d.source("temperature") == GENERATION_CONFIG
    assert d.describe() == "greedy (generation_config.json)"
    assert idle_when_greedy(d.params) == ["top_p"]  # chat notes only what the user gave
    assert d.from_flags == ()
    d = resolve_sampling({"temperature": 0.5}, folder)  # as transformers: the filters stay
    assert d.params == SamplingParams(0.5, 0.8)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "cannot read it as JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"do_sample": "yes"}', "field 'do_sample' must be true or false"),
        (
            '{"temperature": -0.5}',
            "field 'temperature': temperature must be a finite number >= 0, "
            "found -0.5 (pass --temp to use another value)",
        ),
        ('{"top_p": 1.5}', "field 'top_p': top_p must be in [0, 1]"),
        ('{"top_k": 2.5}', "field 'top_k': top_k must be an int >= 0"),
    ],
)
def test_a_bad_generation_config_is_a_clear_error_naming_file_and_field(tmp_path, content, message):
    (tmp_path / GENERATION_CONFIG).write_text(content)
    with pytest.raises(ConfigError) as err:
        resolve_sampling({}, tmp_path)
    assert str(tmp_path / GENERATION_CONFIG) in str(err.value) and message in str(err.value)


def test_a_bad_field_that_a_flag_overrides_is_not_read(tmp_path):
    _config(tmp_path, temperature="hot", top_k=5)
    assert generation_config(tmp_path, skip=("temperature",)) == {"top_k": 5}
    assert resolve_sampling({"temperature": 0.3}, tmp_path).params == SamplingParams(0.3, top_k=5)


def test_a_request_overrides_the_defaults_field_by_field():
    d = SamplingDefaults(
        SamplingParams(0.6, 0.95, 20, 0.0, None), (("temperature", GENERATION_CONFIG),)
    )
    assert d.complete({}) == d.params
    assert d.complete({"temperature": 0.0, "top_p": None}) == SamplingParams(0.0, 0.95, 20)
    assert d.complete({"top_k": 0, "seed": 9}) == SamplingParams(0.6, 0.95, 0, 0.0, 9)
    with pytest.raises(ParameterError, match="top_p must be in"):
        d.complete({"top_p": 2.0})


# ------------------------------------------------------------------------------ a loaded pair
@pytest.fixture
def pair(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH2_HOME", str(tmp_path / "home"))  # an empty profile store
    return d2.Pair.from_models(make_target("llama"), None, make_drafter(2, block_size=8), lookup=2)


def _store_profile(pair, target, drafter, block):
    A.save_profile(
        {"schema": A.SCHEMA, "key": A.profile_key(pair, target, drafter), "chosen_block": block}
    )


def test_resolve_engine_on_a_pair(pair, tmp_path):
    plain = ResolvedPair("org/target", "org/drafter")
    alias = ResolvedPair("org/target", "org/drafter", (16, 8), "some-alias")
    s = resolve_engine(EngineFlags(), pair, plain, None)
    assert (s.block.size, s.block.reason, s.lookup, s.effective_block) == (8, BY_TRAINED, 2, 8)
    assert s.auto_block == s.block and s.sampling.params.greedy
    s = resolve_engine(EngineFlags(), pair, alias, None)
    assert (s.block.size, s.block.reason, s.block.clamped_from) == (8, BY_ALIAS, 16)
    _store_profile(pair, "org/target", "org/drafter", 6)  # `bench --autotune` on this machine
    s = resolve_engine(EngineFlags(), pair, alias, None)
    assert (s.block.size, s.block.reason, s.block.note) == (6, BY_PROFILE, None)
    s = resolve_engine(EngineFlags(block=3), pair, alias, None)
    assert (s.block.size, s.block.reason) == (3, BY_FLAG)
    assert (s.auto_block.size, s.auto_block.reason) == (6, BY_PROFILE)  # chat's /block auto
    s = resolve_engine(EngineFlags(speculative=False), pair, alias, None)
    assert s.effective_block == 1 and s.block.size == 6
    with pytest.raises(ParameterError, match="9 exceeds the drafter's trained block size 8"):
        resolve_engine(EngineFlags(block=9), pair, alias, None)
    folder = _config(tmp_path / "t", do_sample=True, temperature=0.7)
    s = resolve_engine(EngineFlags(sampling={"top_k": 4}), pair, plain, folder)
    assert s.sampling.params == SamplingParams(0.7, top_k=4)


def test_resolve_engine_takes_the_lookup_block_from_the_profile(pair):
    """No profile (or none measured): None, the engine's default; else the measured one, and a
    server refuses a bad one before it starts."""
    plain = ResolvedPair("org/target", "org/drafter")
    assert resolve_engine(EngineFlags(), pair, plain, None).lookup_block is None
    A.save_profile(
        {
            "schema": A.SCHEMA,
            "key": A.profile_key(pair, "org/target", "org/drafter"),
            "chosen_block": 6,
            "chosen_lookup_block": 12,
        }
    )
    s = resolve_engine(EngineFlags(), pair, plain, None)
    assert (s.lookup_block, s.block.size) == (12, 6)
    from dflash2_mlx.serve.app import create_app

    with pytest.raises(ParameterError, match="lookup_block must be an int >= 1"):
        create_app(pair, model_name="m", drafting=Drafting(lookup_block=0))


def test_a_quantized_target_on_the_cpu_is_told_to_measure_its_block():
    """With no profile, a quantized target got block 4 on the CPU and ran at 0.3-0.5x plain
    decoding there, unsaid."""
    import mlx.nn as nn

    import mlx.core as mx

    model = make_target("llama")
    nn.quantize(model, group_size=32, bits=4)
    quantized = d2.Pair.from_models(model, None, make_drafter(2, block_size=8))
    plain = d2.Pair.from_models(make_target("llama"), None, make_drafter(2, 8))
    on_cpu = mx.default_device() == mx.cpu
    s = resolve_engine(EngineFlags(), quantized, ResolvedPair("t", "d"), None)
    assert (QUANTIZED_CPU in s.auto_block.note) == on_cpu
    # unmeasured, a quantized target verifies QUANT_CAP at most (an alias's 16 for its bf16
    # target ran as given on a 4-bit copy of it, on a Mac's GPU too); measured or asked: as is
    assert (s.block.size, s.block.reason) == (5, "quantized target's cap")
    assert "block 5, not the drafter's trained block's 8" in s.block.note
    alias = resolve_engine(
        EngineFlags(), quantized, ResolvedPair("t", "d", block_sizes=(16,)), None
    )
    assert alias.block.size == 5 and "not the alias recommendation's 16" in alias.block.note
    assert (
        resolve_engine(EngineFlags(block=8), quantized, ResolvedPair("t", "d"), None).block.size
        == 8
    )
    trained = plain.drafter.config.block_size  # unquantized: its own, however wide
    assert resolve_engine(EngineFlags(), plain, ResolvedPair("t", "d"), None).block.size == trained
    assert (
        resolve_engine(EngineFlags(), plain, ResolvedPair("t", "d"), None).auto_block.note is None
    )
    for given in (EngineFlags(block=2), EngineFlags(speculative=False)):  # nothing to advise
        auto = resolve_engine(given, quantized, ResolvedPair("t", "d"), None).auto_block
        assert auto.note is None and auto.size == 5  # what `/block auto` or `/spec on` takes


def test_weights_are_wired_on_a_gpu_with_a_recommended_working_set(monkeypatch):
    """As mlx-lm's generate and server: on Apple Silicon the wired limit is the recommended
    working set (weights stay resident), and weights close to it are warned about (a 16 GB
    Mac loading a 16 GB target thrashed or ran out of Metal memory, unsaid); a CPU: nothing."""
    import mlx.core as mx

    from dflash2_mlx.memory import weight_bytes, wire_weights

    model = make_target("llama")
    assert wire_weights(model) is None  # this machine's device reports no working set
    size = weight_bytes(model)
    wired = []
    for limit, warns in ((size * 4, False), (size, True)):
        monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": limit})
        monkeypatch.setattr(mx, "set_wired_limit", lambda n: wired.append(n) or 0)
        said = wire_weights(model)
        assert wired[-1] == limit and (said is not None) == warns
    assert "close to this GPU's recommended working set" in said
