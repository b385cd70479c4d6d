"""The library refuses bad input with a ParameterError naming it (never a crash, never a
silent reinterpretation): prompt ids, seeds, parameter types, load_pair's arguments."""

import json
import re

import mlx.core as mx
import numpy as np
import pytest
import tiny

from dflash2_mlx import GenerationParams, ParameterError, SamplingParams, SpeculativeDecoder
from dflash2_mlx.engine.batch import BatchDecoder
from dflash2_mlx.errors import CompatibilityError
from dflash2_mlx.registry import FetchError
from dflash2_mlx.target.adapter import TargetAdapter

PROMPT = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7]


@pytest.fixture(scope="module")
def decoder():
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2, block_size=4)
    return model, SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)


@pytest.mark.parametrize(
    "prompt,message",
    [
        ([3, tiny.VOCAB, 5], rf"prompt\[1\] = {tiny.VOCAB} is outside the vocabulary \[0, "),
        ([3, 200000, 5], r"prompt\[1\] = 200000 is outside the vocabulary"),
        ([3, -3, 5], r"prompt\[1\] = -3 is outside the vocabulary"),
        ([3, 1.7, 5], r"prompt\[1\] = 1.7 is not a token id"),
        ([True, 4], r"prompt\[0\] = True is not a token id"),
        ("hello", "must be token ids, not text"),
        (5, "must be a sequence of token ids, got int"),
    ],
)
def test_bad_prompt_ids_are_refused_before_anything_runs(decoder, prompt, message):
    _, dec = decoder
    with pytest.raises(ParameterError, match=message):
        dec.generate(prompt, GenerationParams(max_tokens=2))
    with pytest.raises(ParameterError, match=message):  # the batched engine: the same rule
        BatchDecoder(dec).add(prompt, GenerationParams(max_tokens=2))
    with pytest.raises(ParameterError, match=message):  # at the call, not when iterated
        dec.stream(prompt, GenerationParams(max_tokens=2))


@pytest.mark.parametrize("stop", [5, None, [1], ["ok", 2], {"a"}])
def test_text_stop_strings_of_the_wrong_type_are_refused_at_the_call(tiny_pair, stop):
    import dflash2_mlx as d2

    pair = d2.load_pair(*tiny_pair)
    ids = [3, 14, 15]
    with pytest.raises(ParameterError, match="stop must be a string or a list of strings"):
        d2.stream_text(pair, ids, GenerationParams(max_tokens=2), stop=stop)
    with pytest.raises(ParameterError, match="stop must be a string or a list of strings"):
        d2.generate_text(pair, ids, GenerationParams(max_tokens=2), stop=stop)
    with pytest.raises(
        ParameterError, match=r"text needs a pair \(load_pair: a tokenizer and a decoder\)"
    ):
        d2.generate_text(None, ids, GenerationParams(max_tokens=2))


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("hi", "the prompt must be token ids, not text"),
        (None, "the prompt must be a sequence of token ids, got NoneType"),
        (5, "the prompt must be a sequence of token ids, got int"),
        ([[1, 2]], r"the prompt\[0\] = \[1, 2\] is not a token id"),
        (["a"], r"the prompt\[0\] = 'a' is not a token id"),
    ],
)
def test_the_text_layer_names_a_bad_prompt_as_the_engine_does(tiny_pair, prompt, message):
    import dflash2_mlx as d2

    pair = d2.load_pair(*tiny_pair)
    with pytest.raises(ParameterError, match=message):
        d2.generate_text(pair, prompt, GenerationParams(max_tokens=2))


def test_the_text_layer_reads_a_generator_prompt_once_and_returns_logprobs(tiny_pair):
    import dflash2_mlx as d2

    pair = d2.load_pair(*tiny_pair)
    ids = [3, 14, 15]
    params = GenerationParams(max_tokens=4, logprobs=2)
    want = d2.generate_text(pair, ids, params)
    got = d2.generate_text(pair, (t for t in ids), params)
    assert (got.text, got.tokens) == (want.text, want.tokens)
    assert [lp.token for lp in got.logprobs] == got.tokens  # one a token, as the events carry
    with pytest.raises(ParameterError, match="logprobs: generate returns no log-probabilities"):
        pair.generate(ids, params)
    with pytest.raises(ParameterError, match="logprobs: generate_batch returns no log-prob"):
        pair.generate_batch([ids], params)
    # the prompt's own: generate_text returns them; generate and generate_batch refuse them
    # (they were taken and dropped, the prompt read whole for nothing)
    scored = GenerationParams(max_tokens=4, prompt_logprobs=1)
    text = d2.generate_text(pair, ids, scored)
    assert [lp.token for lp in text.prompt_logprobs] == ids[1:] and text.tokens == want.tokens
    assert d2.generate_text(pair, ids, params).prompt_logprobs is None
    for method, call in (
        ("generate", lambda: pair.generate(ids, scored)),
        ("generate_batch", lambda: pair.generate_batch([ids], scored)),
    ):
        with pytest.raises(ParameterError, match=f"prompt_logprobs: {method} returns no"):
            call()
    with pytest.raises(ParameterError, match="thinking must be a grammar.Thinking"):
        pair.json_schema({"type": "object"}, thinking=True)


@pytest.mark.parametrize("stop", ["", ["ok", ""]])
def test_an_empty_stop_string_is_refused_not_dropped(tiny_pair, stop):
    """The server refuses it (it would match everywhere); the library once dropped it."""
    import dflash2_mlx as d2

    pair = d2.load_pair(*tiny_pair)
    with pytest.raises(ParameterError, match="stop strings must not be empty"):
        d2.generate_text(pair, [3, 14, 15], GenerationParams(max_tokens=2), stop=stop)


def test_prompt_ids_as_arrays_are_the_same_prompt(decoder):
    model, dec = decoder
    want = tiny.greedy_reference(model, PROMPT, 6)
    params = GenerationParams(max_tokens=6)
    assert dec.generate(PROMPT, params) == want
    assert dec.generate(np.array(PROMPT, dtype=np.int64), params) == want
    assert dec.generate(mx.array(PROMPT), params) == want


@pytest.mark.parametrize("seed", [2**64, 2**70, -1])
def test_seeds_outside_uint64_are_refused(seed):
    with pytest.raises(ParameterError, match=r"seed must be an int in \[0, 2\*\*64\)") as err:
        SamplingParams(temperature=0.7, seed=seed)
    assert str(err.value).endswith(f"got seed={seed!r}")  # the field alone, not every field


def test_numpy_scalars_and_a_list_of_processors_are_the_same_parameters(decoder):
    """What NumPy code and mlx-lm's make_logits_processors (a list) hand over is accepted as
    the Python values, and runs the same."""
    _, dec = decoder
    bias = lambda tokens, logits: logits  # noqa: E731
    plain = GenerationParams(
        max_tokens=4,
        block_size=2,
        logits_processors=(bias,),
        sampling=SamplingParams(temperature=0.5, seed=3, top_k=5),
    )
    numpy = GenerationParams(
        max_tokens=np.int64(4),
        block_size=np.int32(2),
        logits_processors=[bias],
        sampling=SamplingParams(temperature=np.float32(0.5), seed=np.uint64(3), top_k=np.int8(5)),
    )
    assert numpy == plain and type(numpy.max_tokens) is int
    assert dec.generate(PROMPT, numpy) == dec.generate(PROMPT, plain)
    with pytest.raises(ParameterError, match="max_tokens must be an int >= 1"):
        GenerationParams(max_tokens=np.float64(3.0))


def test_the_largest_seed_runs(decoder):
    _, dec = decoder
    params = GenerationParams(max_tokens=3, sampling=SamplingParams(0.7, seed=2**64 - 1))
    assert dec.generate(PROMPT, params) == dec.generate(PROMPT, params)


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(sampling={"temperature": 0.5}), "sampling must be a SamplingParams, got dict"),
        (dict(speculative="no"), "speculative must be True or False"),
        (dict(speculative=0), "speculative must be True or False"),
        (dict(stop_token_ids=2), "stop_token_ids must be a sequence of token ids, got int"),
        (dict(stop_token_ids="ab"), "stop_token_ids must be token ids, not text"),
        (dict(stop_token_ids=frozenset({-5})), r"stop_token_ids\[0\] = -5 is not a token id"),
        (dict(stop_token_ids=[2.5]), r"stop_token_ids\[0\] = 2.5 is not a token id"),
    ],
)
def test_generation_params_of_the_wrong_type_are_refused(fields, message):
    with pytest.raises(ParameterError, match=message):
        GenerationParams(**fields)


@pytest.mark.parametrize("kind", [set, list, tuple, np.array])
def test_stop_ids_in_any_container_stop_the_same(decoder, kind):
    model, dec = decoder
    ref = tiny.greedy_reference(model, PROMPT, 8)
    params = GenerationParams(max_tokens=8, stop_token_ids=kind([ref[3]]))
    assert params.stop_token_ids == frozenset({ref[3]})
    assert dec.generate(PROMPT, params) == ref[: ref.index(ref[3]) + 1]


def test_a_pairs_stop_token_ids_add_to_its_end_of_turn_ids():
    """Pair.generate with stop_token_ids still ends at EOS (they once replaced it and the
    reply ran on past its end of turn); the engine stops at exactly the ids it is given."""
    import types

    import dflash2_mlx as d2

    model, drafter = tiny.make_target("llama"), tiny.make_drafter(2, block_size=4)
    tokenizer = types.SimpleNamespace(eos_token_ids=set())
    pair = d2.Pair.from_models(model, tokenizer, drafter)
    full = pair.generate(PROMPT, GenerationParams(max_tokens=12))[0]  # no EOS yet
    eos = full[4]
    other = next(t for t in range(tiny.VOCAB) if t not in full)  # never generated
    tokenizer.eos_token_ids = {eos}
    params = GenerationParams(max_tokens=12, stop_token_ids=[other])
    assert pair.with_defaults(params).stop_token_ids == frozenset({eos, other})
    assert pair.generate(PROMPT, params)[0] == full[: full.index(eos) + 1]
    assert pair.decoder.generate(PROMPT, params) == full  # exactly the ids it is given


def test_load_pair_refuses_an_unknown_dtype(tiny_pair):
    import dflash2_mlx as d2

    with pytest.raises(ParameterError, match="dtype must be one of float32, bfloat16, float16"):
        d2.load_pair(*tiny_pair, dtype="int8")


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("hidden_size", "576", "config.json: hidden_size must be a whole number >= 1, got '576'"),
        ("tie_word_embeddings", "yes", "tie_word_embeddings must be true or false, got 'yes'"),
        ("eos_token_id", "abc", "eos_token_id must be a token id (an integer >= 0) or a list"),
        ("eos_token_id", [1, "x"], "eos_token_id must be a token id"),
    ],
)
def test_a_target_config_field_of_the_wrong_type_is_named(tiny_pair, tmp_path, field, value, says):
    """These were tracebacks from transformers' config classes, or a TypeError naming nothing."""
    import shutil

    import dflash2_mlx as d2

    broken = tmp_path / "t"
    shutil.copytree(tiny_pair[0], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(CompatibilityError, match=re.escape(says)):
        d2.load_pair(broken, tiny_pair[1])


def test_an_end_of_sequence_id_past_the_vocabulary_is_refused_at_load(tiny_pair, tmp_path):
    """It loaded, then every request was refused for `stop_token_ids` it never sent."""
    import shutil

    import dflash2_mlx as d2

    broken = tmp_path / "t"
    shutil.copytree(tiny_pair[0], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "eos_token_id": 99999}))
    (broken / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 99999]}))
    with pytest.raises(CompatibilityError) as err:
        d2.load_pair(broken, tiny_pair[1])
    assert str(err.value).startswith(f"target {broken}, drafter ")
    assert "end-of-sequence id 99999 is outside the target's vocabulary" in str(err.value)


def test_load_pair_names_a_missing_folder_and_a_broken_config(tiny_pair, tmp_path):
    import shutil

    import dflash2_mlx as d2

    with pytest.raises(FetchError, match="no such folder"):
        d2.load_pair(tmp_path / "nowhere", tiny_pair[1])
    broken = tmp_path / "broken"
    shutil.copytree(tiny_pair[0], broken)
    (broken / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(CompatibilityError, match=r"broken/config.json: not a readable JSON"):
        d2.load_pair(broken, tiny_pair[1])
    (broken / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(CompatibilityError, match="expected a JSON object, found list"):
        d2.load_pair(broken, tiny_pair[1])
    shutil.copy(tiny_pair[0] / "config.json", broken / "config.json")
    (broken / "tokenizer_config.json").write_text('{"bos_token": ')
    with pytest.raises(CompatibilityError, match=r"broken/tokenizer_config.json: not a readable"):
        d2.load_pair(broken, tiny_pair[1])
    shutil.copy(tiny_pair[0] / "tokenizer_config.json", broken / "tokenizer_config.json")
    (broken / "tokenizer.json").unlink()
    with pytest.raises(CompatibilityError, match=r"broken: no tokenizer files \(tokenizer.json"):
        d2.load_pair(broken, tiny_pair[1])
    (broken / "config.json").unlink()
    with pytest.raises(CompatibilityError, match=r"broken: config.json is missing"):
        d2.load_pair(broken, tiny_pair[1])
    # a Hugging Face cache's repo folder: the snapshot that holds the model is named
    repo = tmp_path / "models--org--name"
    for snapshot in ("abc123", "fff000"):  # refs/main names the current one
        shutil.copytree(tiny_pair[0], repo / "snapshots" / snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    with pytest.raises(CompatibilityError, match=r"the model is in .*snapshots/abc123, or give"):
        d2.load_pair(repo, tiny_pair[1])
    # a sharded model whose download stopped: the missing file is named
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_pair[0], sharded)
    weights = next(sharded.glob("*.safetensors"))
    index = {
        "weight_map": {"a.weight": weights.name, "b.weight": "model-00002-of-00002.safetensors"}
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        CompatibilityError, match=r"model-00002-of-00002.safetensors missing \(1 of"
    ):
        d2.load_pair(sharded, tiny_pair[1])
    drafter = tmp_path / "drafter"
    shutil.copytree(tiny_pair[1], drafter)
    (drafter / "config.json").unlink()
    (drafter / "config.json").mkdir()  # a folder where the file should be
    with pytest.raises(d2.DFlash2Error, match=r"drafter/config.json: cannot read it"):
        d2.load_pair(tiny_pair[0], drafter)


def test_load_pair_offline_never_downloads_the_target(tiny_pair, hf_offline):
    """A repo id that is not in the cache: offline=True is a clear error, not a hub call."""
    import dflash2_mlx as d2

    with pytest.raises(FetchError, match="not in the local Hugging Face cache"):
        d2.load_pair("someone/not-cached-model", tiny_pair[1], offline=True)


def test_load_pair_flags_must_be_booleans(tiny_pair):
    """A truthy string is not a yes: offline="no" would have gone offline."""
    import dflash2_mlx as d2

    for flag in ("offline", "full_vocab"):
        with pytest.raises(ParameterError, match=f"{flag} must be True or False, got 'no'"):
            d2.load_pair(*tiny_pair, **{flag: "no"})


def test_load_pair_by_a_registered_name_needs_no_drafter(monkeypatch, tiny_pair):
    """load_pair(NAME): the pair `dflash2 models` lists under NAME (here a registry entry
    pointing at the tiny pair)."""
    import dflash2_mlx as d2
    from dflash2_mlx import registry

    entry = registry.ModelEntry(
        alias="tiny-test", target=str(tiny_pair[0]), drafter=str(tiny_pair[1]), block_sizes=(4,)
    )
    monkeypatch.setattr(registry, "_names", lambda: {"tiny-test": entry})
    pair = d2.load_pair("tiny-test")
    assert pair.decoder.drafter.config.block_size == 8
    # a pair's name with a drafter: that pair's target, this drafter (as `chat NAME --drafter`)
    assert d2.load_pair("tiny-test", tiny_pair[1]).decoder.target.vocab_size > 0
    with pytest.raises(FetchError, match="target /nowhere/model: no such folder"):
        d2.load_pair("/nowhere/model")
    for folder in (tiny_pair[0], str(tiny_pair[0])):  # a folder of no registered pair
        with pytest.raises(d2.DFlash2Error, match="not a pair .* pass its drafter too"):
            d2.load_pair(folder)
    with pytest.raises(d2.DFlash2Error, match=r"tiny-tset: not a pair .*did you mean tiny-test"):
        d2.load_pair("tiny-tset")


def test_a_half_precision_target_gets_a_float32_drafter_on_the_cpu(tiny_pair, tmp_path):
    """A bf16 target made a bf16 drafter, which drafted 3.4x slower on the CPU (no fast
    half-precision matmul there). (Outputs are not compared with plain decoding here: bf16
    near-ties between a verify's and a plain step's matmul shapes are a BLAS's to break.)"""
    import shutil

    import dflash2_mlx as d2
    from dflash2_mlx.quant import weight_dtype

    half = tmp_path / "bf16"
    shutil.copytree(tiny_pair[0], half)
    for f in half.glob("*.safetensors"):
        weights = {k: v.astype(mx.bfloat16) for k, v in mx.load(str(f)).items()}
        mx.save_safetensors(str(f), weights, metadata={"format": "mlx"})
    pair = d2.load_pair(half, tiny_pair[1])
    want = "float32" if mx.default_device() == mx.cpu else "bfloat16"
    assert weight_dtype(pair.drafter) == want and weight_dtype(pair.model) == "bfloat16"
    assert weight_dtype(d2.load_pair(half, tiny_pair[1], dtype="bfloat16").drafter) == "bfloat16"
    events = list(pair.stream([5, 9, 14, 20, 33, 40], d2.GenerationParams(24, block_size=4)))
    assert sum(len(ev.tokens) for ev in events) == 24 and any(ev.drafted for ev in events)


def test_objects_of_the_wrong_kind_are_named_not_crashed_on(decoder, tmp_path):
    """What a developer builds by hand: a bare model where the engine takes an adapter, a
    folder's name where a Drafter goes, a constraint factory or a logits processor that
    returns the wrong thing."""
    import dflash2_mlx as d2

    model, dec = decoder
    with pytest.raises(ParameterError, match="target must be a TargetAdapter.*Pair.from_models"):
        SpeculativeDecoder(model, dec.drafter)
    with pytest.raises(ParameterError, match="drafter must be a Drafter, got str"):
        SpeculativeDecoder(dec.target, "drafter")
    with pytest.raises(ParameterError, match=r"drafter must be a Drafter \(load_drafter"):
        d2.Pair.from_models(model, None, "drafter")
    with pytest.raises(ParameterError, match="model must be a Drafter, got str"):
        d2.save_drafter("drafter", tmp_path / "d")
    with pytest.raises(ParameterError, match="the factory returned int, not a TokenConstraint"):
        dec.generate(PROMPT, GenerationParams(max_tokens=2, constraint=lambda: 5))

    def none(tokens, logits):
        return None

    with pytest.raises(ParameterError, match="'none' returned NoneType, not the logits"):
        dec.generate(PROMPT, GenerationParams(max_tokens=2, logits_processors=(none,)))
