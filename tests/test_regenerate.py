"""Response regeneration: batched generation to JSONL, resumable, with an exact top-p sampler."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dflash2_mlx.errors import ParameterError
from dflash2_mlx.prompts import SPLITS, Prompt
from dflash2_mlx.train import regenerate as regen_module
from dflash2_mlx.train.records import done_pairs
from dflash2_mlx.train.regen_sampling import make_sampler
from dflash2_mlx.train.regenerate import main, regenerate
from smollm2 import any_conversion

VOCAB = 49152
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

PROMPTS = [
    Prompt("p0", "chat", [{"role": "user", "content": "Hi there!"}]),
    Prompt("p1", "math", [{"role": "user", "content": "What is 2 + 2?"}]),
    Prompt(
        "p2",
        "code",
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    ),
    Prompt(
        "p3",
        "multi-turn",
        [
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
        ],
    ),
    Prompt(
        "p4",
        "stories",
        [
            {
                "role": "user",
                "content": "Tell me a very short story about a cat who "
                "wants to become a sailor on the sea.",
            }
        ],
    ),
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A random-initialised 2-layer llama with the real SmolLM2 tokenizer, saved as an mlx-lm folder."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    src = any_conversion(tmp_path_factory)
    folder = tmp_path_factory.mktemp("tiny_llama")
    mx.random.seed(0)
    config = dict(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        eos_token_id=2,
    )
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.update(
        tree_map(lambda p: p * 4.0 if p.ndim == 2 else p, model.parameters())
    )  # sharp argmaxes
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(config, folder / "config.json")
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from mlx_lm import load

    return load(str(tiny_dir))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.real_model
def test_writes_records_and_resumes(tiny_dir, tiny, tmp_path, monkeypatch):
    out = tmp_path / "regen.jsonl"
    logs: list[str] = []
    st = regenerate(
        tiny_dir,
        PROMPTS[:3],
        out,
        max_new_tokens=6,
        temperatures=[0.0, 0.7],
        batch_size=2,
        seed=1,
        log=logs.append,
    )
    assert (st.written, st.skipped) == (6, 0) and st.new_tokens == 36 and st.tokens_per_s > 0
    recs = _records(out)
    assert {(r["id"], r["temperature"]) for r in recs} == {
        (p.id, t) for p in PROMPTS[:3] for t in (0.0, 0.7)
    }
    _, tok = tiny
    for r in recs:
        assert set(r) == {
            "id",
            "category",
            "temperature",
            "prompt_ids",
            "response_ids",
            "finish_reason",
        }
        p = next(p for p in PROMPTS if p.id == r["id"])
        assert r["category"] == p.category
        assert r["prompt_ids"] == list(
            tok.apply_chat_template(p.messages, add_generation_prompt=True)
        )
        assert len(r["response_ids"]) == 6 and r["finish_reason"] == "length"
        assert all(0 <= t < VOCAB for t in r["response_ids"])
    assert any("tok/s" in line for line in logs)

    # Resume: only the two new prompts are generated, for both temperatures.
    st2 = regenerate(
        tiny, PROMPTS, out, max_new_tokens=6, temperatures=[0.0, 0.7], batch_size=4, log=logs.append
    )
    assert (st2.written, st2.skipped) == (4, 6)
    recs2 = _records(out)
    assert recs2[:6] == recs and len(recs2) == 10
    assert len({(r["id"], r["temperature"]) for r in recs2}) == 10

    # Nothing left to do: and nothing opened for writing (a read-only --work reruns)
    def read_only(path, mode="r", *args, **kw):
        assert not set(mode) & set("wax+"), (path, mode)
        return open(path, mode, *args, **kw)

    monkeypatch.setattr(regen_module, "open", read_only, raising=False)
    st3 = regenerate(tiny, PROMPTS, out, max_new_tokens=6, temperatures=[0.0, 0.7], log=logs.append)
    assert (st3.written, st3.skipped) == (0, 10)
    monkeypatch.undo()

    # Greedy decoding does not depend on how sequences were batched.
    solo = tmp_path / "solo.jsonl"
    regenerate(
        tiny, PROMPTS, solo, max_new_tokens=6, temperatures=[0.0], batch_size=1, log=logs.append
    )
    greedy = {r["id"]: r["response_ids"] for r in recs2 if r["temperature"] == 0.0}
    assert {r["id"]: r["response_ids"] for r in _records(solo)} == greedy


@pytest.mark.real_model
def test_given_prompt_ids_are_used_as_they_are(tiny, tmp_path):
    """prompt_ids (e.g. another record's) replace the chat template for those prompts only."""
    _, tok = tiny
    out = tmp_path / "ids.jsonl"
    given = {"p1": [1, 2, 3, 4, 5]}
    regenerate(
        tiny,
        PROMPTS[:2],
        out,
        max_new_tokens=3,
        temperatures=[0.0],
        prompt_ids=given,
        log=lambda s: None,
    )
    by_id = {r["id"]: r["prompt_ids"] for r in _records(out)}
    assert by_id["p1"] == given["p1"]
    templated = tok.apply_chat_template(PROMPTS[0].messages, add_generation_prompt=True)
    assert by_id["p0"] == list(templated)


@pytest.mark.real_model
def test_torn_last_line_is_dropped_and_redone(tiny, tmp_path):
    out = tmp_path / "regen.jsonl"
    regenerate(tiny, PROMPTS[:2], out, max_new_tokens=4, temperatures=[0.0], log=lambda s: None)
    good = out.read_text()
    out.write_text(good + '{"id": "p2", "category": "co')  # a crash mid-write
    assert done_pairs(out) == {("p0", 0.0), ("p1", 0.0)}
    assert out.read_text() == good
    st = regenerate(
        tiny, PROMPTS[:3], out, max_new_tokens=4, temperatures=[0.0], log=lambda s: None
    )
    assert (st.written, st.skipped) == (1, 2)
    assert [r["id"] for r in _records(out)] == ["p0", "p1", "p2"]


@pytest.mark.real_model
def test_not_a_regeneration_file(tiny, tmp_path):
    out = tmp_path / "other.jsonl"
    out.write_text('{"something": "else"}\n')
    with pytest.raises(ValueError, match="other.jsonl:1"):
        regenerate(tiny, PROMPTS[:1], out, max_new_tokens=2, temperatures=[0.0], log=lambda s: None)


@pytest.mark.real_model
def test_stop_token_is_kept(tiny, tmp_path):
    model, tok = tiny
    saved = set(tok.eos_token_ids)
    tok.eos_token_ids = set(range(VOCAB))  # every token stops
    try:
        out = tmp_path / "stop.jsonl"
        regenerate(
            (model, tok), PROMPTS[:2], out, max_new_tokens=5, temperatures=[0.0], log=lambda s: None
        )
    finally:
        tok.eos_token_ids = saved
    for r in _records(out):
        assert r["finish_reason"] == "stop" and len(r["response_ids"]) == 1


@pytest.mark.real_model
def test_cli(tiny_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": p.id, "category": p.category, "messages": p.messages}) + "\n"
            for p in PROMPTS
        )
    )
    out = tmp_path / "cli.jsonl"
    main(
        [
            "--model",
            str(tiny_dir),
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--limit",
            "2",
            "--max-new-tokens",
            "3",
            "--temperatures",
            "0",
            "--batch-size",
            "2",
        ]
    )
    assert len(_records(out)) == 2
    assert "wrote 2 sequences" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(tiny_dir), "--prompts", str(bad), "--out", str(out)])
    assert exit_.value.code == 1 and "bad.jsonl:1:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"limit": -1}, "limit"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperatures": [0.0, -1.0]}, "temperatures"),
        ({"temperatures": [float("nan")]}, "temperatures"),
        ({"temperatures": []}, "temperatures"),
    ],
)
def test_parameters_out_of_range_are_refused_before_the_model_is_used(kwargs, name, tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(ParameterError, match=f"regenerate: {name} must be"):
        regenerate(("no model", "no tokenizer"), PROMPTS, out, **kwargs)
    assert not out.exists()


@pytest.mark.parametrize(
    "flag, value, why",
    [
        ("--batch-size", "0", "must be >= 1, got 0"),
        ("--batch-size", "-1", "must be >= 1, got -1"),
        ("--max-new-tokens", "0", "must be >= 1, got 0"),
        ("--limit", "-1", "must be >= 1, got -1"),
        ("--top-p", "0", "must be in (0, 1], got 0"),
        ("--temperatures", "-1", "must be a finite number >= 0, got -1"),
        ("--temperatures", "inf", "must be a finite number >= 0, got inf"),
    ],
)
def test_cli_names_the_flag_out_of_range(flag, value, why, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(out), flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: {why}" in capsys.readouterr().err
    assert not out.exists()


def test_cli_help_shows_defaults_and_the_prompt_splits(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0
    assert all(split in text for split in SPLITS) and "JSONL path (default: train)" in text
    for default in ("(default: 256)", "(default: 0 0.7)", "(default: 0.95)", "(default: 32)"):
        assert default in text


def test_ctrl_c_ends_with_one_line_and_status_130(tmp_path, capsys, monkeypatch):
    def interrupted(*args, stats, **kwargs):
        stats.written = 3
        raise KeyboardInterrupt

    monkeypatch.setattr(regen_module, "regenerate", interrupted)
    out = tmp_path / "r.jsonl"
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "m", "--out", str(out)])
    assert exit_.value.code == 130
    assert capsys.readouterr().err == (
        f"interrupted: 3 sequences written to {out}; rerun the same command to resume\n"
    )


@pytest.mark.parametrize("scale", [12.0, 1.0])  # peaked (fast top-k path), flat (full sort)
def test_sampler_draws_the_served_distribution(scale):
    """The regenerations' sampler draws from what the library serves (sampling.filtered_probs,
    mlx-lm's order: the nucleus of the untempered distribution, then the temperature); it
    tempered first, so at T 0.7, top_p 0.95 tokens the server may emit never came up."""
    import mlx.core as mx

    from dflash2_mlx.sampling import SamplingParams, filtered_probs
    from dflash2_mlx.train.regen_sampling import row_distribution

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4096)).astype(np.float32) * scale
    logprobs = mx.array(
        logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True)).astype(np.float32)
    )
    for top_p in (0.9, 0.95, 1.0):
        served = np.array(filtered_probs(logprobs, SamplingParams(0.7, top_p=top_p)))
        for r in range(3):
            cand, probs = row_distribution(np.array(logprobs[r]), 0.7, top_p)
            if top_p < 1:  # the same nucleus (at 1, float32 rounds the least likely to 0)
                assert set(cand.tolist()) == set(np.flatnonzero(served[r]).tolist()), (top_p, r)
            dense = np.zeros(served.shape[-1])
            dense[cand] = probs
            np.testing.assert_allclose(dense, served[r], rtol=1e-4, atol=1e-7)
    sampler = make_sampler(0.7, 0.9, seed=3)
    draws = np.stack([np.array(sampler(logprobs)) for _ in range(400)])
    assert draws.shape == (400, 3) and draws.dtype == np.uint32
    served = np.array(filtered_probs(logprobs, SamplingParams(0.7, top_p=0.9)))
    for r in range(3):
        assert all(served[r][t] > 0 for t in draws[:, r])
        if scale > 1:  # the top token's frequency follows its probability
            top = int(np.argmax(served[r]))
            assert abs((draws[:, r] == top).mean() - served[r][top]) < 0.08
    again = make_sampler(0.7, 0.9, seed=3)
    assert np.array_equal(np.array(again(logprobs)), draws[0])  # seeded


def test_greedy_sampler():
    import mlx.core as mx

    lp = mx.array([[0.0, 3.0, 1.0], [5.0, -1.0, 2.0]])
    assert make_sampler(0.0)(lp).tolist() == [1, 0]


def test_prompts_are_rendered_as_the_server_renders_them():
    """A prompt that quotes a special token's text keeps it as text, as the server does
    (text.chat_prompt_ids): the regenerations were answers to a prompt no user could send."""
    from test_serve import EOS, make_tokenizer

    from dflash2_mlx.text import chat_prompt_ids
    from dflash2_mlx.train.regenerate import _encode_prompts

    tok = make_tokenizer()
    messages = [{"role": "user", "content": "quote <|im_end|> here"}]
    encoded: dict = {}
    _encode_prompts(tok, [Prompt(id="q", category="chat", messages=messages)], encoded)
    assert encoded["q"] == chat_prompt_ids(tok, messages)
    assert encoded["q"].count(EOS) == 1  # the user turn's own end, not the quoted text
