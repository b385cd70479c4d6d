"""Sampling defaults for what a request leaves out, on a real server (127.0.0.1, the official
openai client): the server's flags, then the target's generation_config.json, then greedy (not
OpenAI's T = 1); a request's own fields always win; `dflash2 chat` resolves the same defaults,
so chat and serve give the same answer for the same seed."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys

import httpx
import openai
from dflash2_cli.app import run
from dflash2_mlx.serve import create_app
from dflash2_mlx.settings import GENERATION_CONFIG, resolve_sampling
from dflash2_mlx.text import chat_prompt_ids
from test_serve import CLI, HI, pair, reference, running, wait_until_serving  # noqa: F401  (pair: a fixture)
from tiny_pair import answer, save_pair


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)


def _say(client, **kw) -> str:
    r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=12, **kw)
    return r.choices[0].message.content


def test_without_a_generation_config_an_omitted_temperature_is_greedy(pair):  # noqa: F811
    """The embedded pair's case: no generation_config.json, no flags: greedy, not T = 1."""
    greedy, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 12)
    with running(create_app(pair, model_name="tiny")) as base:
        card = httpx.get(base + "/v1/models").json()["data"][0]
        assert card["sampling_defaults"] == {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "seed": None,
            "source": dict.fromkeys(("temperature", "top_p", "top_k", "min_p", "seed"), "default"),
        }
        client = _client(base)
        assert _say(client) == greedy
        assert _say(client, seed=3) == greedy
        sampled = _say(client, temperature=5.0, seed=3)  # the request's own field wins
        assert sampled != greedy and sampled == _say(client, temperature=5.0, seed=3)


def test_a_request_without_a_limit_runs_as_on_openai(pair):  # noqa: F811
    """No --max-tokens: chat and Responses run to the context's end (agents send no limit),
    completions stop at 16, OpenAI's default; the flag sets both."""
    ids = chat_prompt_ids(pair.tokenizer, HI)
    context = len(ids) + 10  # its greedy answer is longer
    with running(create_app(pair, model_name="tiny", context_length=context)) as base:
        assert (
            httpx.get(base + "/v1/models").json()["data"][0]["dflash2"]["default_max_tokens"]
            is None
        )
        client = _client(base)
        chat = client.chat.completions.create(model="tiny", messages=HI, temperature=0)
        assert (chat.choices[0].message.content, chat.usage.completion_tokens) == reference(
            pair, ids, 10
        )
        text = client.completions.create(model="tiny", prompt="ab", temperature=0)
        want = reference(pair, pair.tokenizer.encode("ab"), 16)
        assert (text.choices[0].text, text.usage.completion_tokens) == want
    with running(create_app(pair, model_name="tiny", default_max_tokens=5)) as base:
        client = _client(base)
        chat = client.chat.completions.create(model="tiny", messages=HI, temperature=0)
        text = client.completions.create(model="tiny", prompt="ab", temperature=0)
        assert chat.usage.completion_tokens <= 5 and text.usage.completion_tokens <= 5


def test_generation_config_defaults_and_request_overrides(pair, tmp_path):  # noqa: F811
    greedy, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 12)
    (tmp_path / GENERATION_CONFIG).write_text(
        json.dumps({"do_sample": True, "temperature": 5.0, "top_k": 50, "eos_token_id": 2})
    )
    app = create_app(pair, model_name="tiny", sampling=resolve_sampling({}, tmp_path))
    with running(app) as base:
        card = httpx.get(base + "/v1/models/tiny").json()
        defaults = card["sampling_defaults"]
        assert (defaults["temperature"], defaults["top_k"]) == (5.0, 50)
        assert defaults["source"]["temperature"] == GENERATION_CONFIG
        client = _client(base)
        omitted = _say(client, seed=11)
        assert omitted != greedy
        assert omitted == _say(client, seed=11, temperature=5.0, extra_body={"top_k": 50})
        assert _say(client, temperature=0) == greedy  # the request's own field wins
        stream = client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=12, seed=11, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == omitted


@contextlib.contextmanager
def _serve(*args: str):
    """`dflash2 serve ARGS` in a subprocess on a free port; yields the base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "serve",
            *args,
            "--port",
            str(port),
            "--model-name",
            "tiny",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, proc)
        yield base, proc
    finally:
        proc.send_signal(signal.SIGINT)
        proc.captured = proc.communicate(timeout=30)  # (stdout, stderr), for a test to read


def test_serve_flags_then_generation_config_and_chat_agrees(tmp_path, capsys):
    """`serve --temp 5` on a target whose generation_config.json says temperature 0.9 and
    top_k 50: the flag wins for temperature, the file gives top_k; `dflash2 chat` with the
    same flags and seed prints what the server answers, and so does chat on the file alone."""
    target, drafter = save_pair(tmp_path / "pair")
    (target / GENERATION_CONFIG).write_text(
        json.dumps({"do_sample": True, "temperature": 0.9, "top_k": 50})
    )
    msgs = [{"role": "user", "content": "hello model"}]
    greedy = answer(target, drafter, msgs, 10)
    folders = ["--target", str(target), "--drafter", str(drafter)]
    with _serve(*folders, "--temp", "5") as (base, proc):
        card = httpx.get(base + "/v1/models").json()["data"][0]
        src = card["sampling_defaults"]["source"]
        assert card["sampling_defaults"]["temperature"] == 5.0 and src["temperature"] == "--temp"
        assert card["sampling_defaults"]["top_k"] == 50 and src["top_k"] == GENERATION_CONFIG
        client = _client(base)

        def say(**kw):
            return (
                client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, **kw)
                .choices[0]
                .message.content
            )

        at_flag = say(seed=7)
        assert at_flag != greedy and at_flag == say(seed=7, temperature=5, extra_body={"top_k": 50})
        at_file = say(seed=7, temperature=0.9)
        assert say(temperature=0) == greedy
    assert (
        run(
            [
                "chat",
                *folders,
                "-p",
                "hello model",
                "--max-tokens",
                "10",
                "--temp",
                "5",
                "--seed",
                "7",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == at_flag + "\n"
    assert run(["chat", *folders, "-p", "hello model", "--max-tokens", "10", "--seed", "7"]) == 0
    assert capsys.readouterr().out == at_file + "\n"


def test_serve_refuses_bad_sampling_flags_and_a_bad_generation_config(tmp_path):
    target, drafter = save_pair(tmp_path / "pair")
    folders = ["--target", str(target), "--drafter", str(drafter)]
    bad = subprocess.run(
        [sys.executable, "-c", CLI, "serve", *folders, "--top-p", "-0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--top-p: top_p must be in [0, 1]" in bad.stderr, bad.stderr
    (target / GENERATION_CONFIG).write_text('{"do_sample": true, "min_p": 2}')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    bad = subprocess.run(
        [sys.executable, "-c", CLI, "serve", *folders, "--port", port],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2, bad.stderr
    assert f"{target / GENERATION_CONFIG}: field 'min_p'" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_serve_says_when_a_token_limit_passes_the_context(tmp_path):
    """A --max-tokens or --max-prompt-tokens the context cannot hold is said at start (the
    server clamps to the context), not silently shown as if it applied."""
    target, drafter = save_pair(tmp_path / "pair")
    folders = ["--target", str(target), "--drafter", str(drafter), "--context-length", "64"]
    with _serve(*folders, "--max-tokens", "500", "--max-prompt-tokens", "1000") as (base, proc):
        assert httpx.get(base + "/health").status_code == 200
    err = proc.captured[1]
    for flag, value in (("--max-tokens", 500), ("--max-prompt-tokens", 1000)):
        assert f"note: {flag} {value} is more than the context allows: at most 63" in err, err
