"""The `dflash2` command line: help, version, one-line user errors (exit 2), models, pull, and
`chat --prompt` on a tiny real pair saved to disk."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from dflash2_cli.app import app, run
from offline import fake_hf_repo
from tiny_pair import answer, save_tokenizer

COMMANDS = sorted(typer.main.get_command(app).commands)
HEAVY = (
    "mlx",
    "mlx_lm",
    "transformers",
    "huggingface_hub",
    "numpy",
    "tokenizers",
    "fastapi",
    "uvicorn",
    "matplotlib",
)


def _py(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, **kw
    )


def test_commands_are_registered():
    assert {"chat", "models", "pull", "doctor"} <= set(COMMANDS)


def test_importing_the_app_and_help_load_no_model_code():
    code = (
        "import sys\n"
        "import dflash2_cli.app as a\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = lambda: sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "assert not loaded(), loaded()\n"
        f"for argv in (['--help'], *[[c, '--help'] for c in {COMMANDS!r}]):\n"
        "    assert a.run(argv) == 0, argv\n"
        "assert not loaded(), loaded()\n"
        "print('light')\n"
    )
    out = _py(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("light")


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in COMMANDS])
def test_help_has_an_example(argv, capsys):
    assert run(argv) == 0
    out = capsys.readouterr().out
    assert "Usage" in out and "Example: dflash2" in out


def test_bare_command_prints_help(capsys):
    assert run([]) == 0
    assert "Commands" in capsys.readouterr().out


def test_version_via_console_script_and_module():
    from importlib.metadata import version

    script = Path(sys.executable).parent / "dflash2"  # the installed console script
    for cmd in ([sys.executable, "-m", "dflash2_cli.app"], [str(script)]):
        if not Path(cmd[0]).exists():
            continue
        out = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"dflash2 {version('dflash2')}"


NOWHERE = ["--target", "/nonexistent-t", "--drafter", "/nonexistent-d"]
BAD = [
    (["chat", "--temp", "abc"], "--temp"),
    (["chat", "--temp", "-1"], "temperature must be"),
    (["chat", "--top-p", "1.5"], "top_p must be in [0, 1]"),
    (["chat", "--top-k", "-3"], "top_k must be"),
    (["chat", "--min-p", "1.5"], "min_p must be in [0, 1]"),
    (["chat", "--seed", "-1"], "seed must be"),
    (["evaluate", "--seed", str(2**64)], "'--seed': Input should be less than or equal to"),
    (["chat", "--max-tokens", "0"], "--max-tokens: max_tokens must be"),
    (["chat", "--repetition-penalty", "0"], "--repetition-penalty: repetition_penalty: must"),
    (["chat", "--repetition-penalty", "inf"], "--repetition-penalty: repetition_penalty: must"),
    (["chat", "--max-tokens", "many"], "--max-tokens"),
    (["chat", "--block", "0"], "block_size must be"),
    (["chat", "-p", "hi", "--block", "3", "--no-spec"], "--block has no effect with --no-spec"),
    (["chat", "-p", "hi", "--lookup", "2", "--no-spec"], "--lookup has no effect with --no-spec"),
    (["serve", "--block", "3", "--no-spec"], "--block has no effect with --no-spec"),
    (["serve", "--lookup", "0", "--no-spec"], "--lookup has no effect with --no-spec"),
    (["serve", "--draft-vocab", "100", "--no-spec"], "--draft-vocab has no effect with --no-spec"),
    (["serve", "--no-spec", "--no-datastore"], "--no-datastore has no effect with --no-spec"),
    (["chat", "--lookup", "-1"], "--lookup"),
    (["chat", "--lookup", "65"], "--lookup"),  # a repeat that long never happens: not ignored
    (["chat", "-p"], "requires an argument. (see 'dflash2 chat --help')"),
    # evaluate reads its prompt file before any model loads (this pair does not exist)
    (["evaluate", "--prompts", "/no/such/prompts.jsonl", *NOWHERE], "/no/such/prompts.jsonl"),
    (["chat", "--prompt", "  "], "--prompt is empty"),
    (["chat", "-p", "a\udcffb"], "--prompt is not valid UTF-8 (byte 0xff) at character 1"),
    (["chat", "-p", "hi", "--no-spec", "--no-datastore"], "a --prompt answer cannot turn spec"),
    (["chat", "-p", "hi", "--no-spec", "--full-vocab"], "--full-vocab has no effect with --no"),
    (["chat", "-p", "hi", "--no-thinking", "--thinking-budget", "9"], "--thinking-budget has no"),
    (["bench", "--json", "--no-plot"], "--json needs a file path, got '--no-plot'"),
    (["serve", "--cors", " , "], "--cors ' , ' names nothing"),
    (["train", "x", "-o", "o", "--init-from", "d", "--no-selector"], "cannot start with --no-conv"),
    (["train", "x", "-o", "o", "--prompts", "a@0+b@0.7", "--temperatures", "0"], "every --prompts"),
    (
        ["train", "x", "-o", "o", "--corpus", "c", "--corpus-ratio", "0", "--stream-passes", "3"],
        "--stream-passes: no effect with --corpus-ratio 0",
    ),
    (["train", "x", "-o", "o", "--init-from", "d", "--ablation"], "cannot start an --ablation"),
    (["train", "x", "-o", "o", "--lr", "0"], "--lr 0 would leave the drafter as it starts"),
    (["train", "x", "-o", "o", "--work", "o/w"], "--work o/w and --out o nest"),
    (["train", "x", "-o", "w/o", "--work", "w"], "--work w and --out w/o nest"),
    (["train", "x", "-o", "o", "--layer-ids", ""], "--layer-ids takes comma-separated integers"),
    (["serve", "--allowed-hosts", ""], "--allowed-hosts '' names nothing"),
    # the address fails first: no warning about serving it without a key before the error
    (["serve", "--host", "999.1.1.1", "--port", "8655"], "cannot listen on 999.1.1.1:8655: "),
    (["serve", "--host", "fe80::1", "--port", "8655"], "cannot listen on [fe80::1]:8655: "),
    (["serve", "--host", "[fe80::1]", "--port", "8655"], "cannot listen on [fe80::1]:8655: "),
    (["serve", "--api-key", "secret "], "starts or ends with whitespace, which no client can"),
    (["serve", "--api-key", "sécret"], "--api-key must be printable ASCII"),
    (["bench", "--plot", "--limit"], "--plot needs a file path, got '--limit'"),
    (["evaluate", "--json", "--offline", *NOWHERE], "--json needs a file path, got '--offline'"),
    # evaluate checks its lists before loading (this pair does not exist)
    (["evaluate", "--blocks", "0", *NOWHERE], "--blocks: block_size must be an int >= 1"),
    (["evaluate", "--blocks", "4,x", *NOWHERE], "--blocks takes comma-separated integers"),
    (["evaluate", "--temperatures", "-1", *NOWHERE], "--temperatures: temperature must be"),
    (["evaluate", "--temperatures", "0,hot", *NOWHERE], "--temperatures takes comma-separated"),
    (
        ["evaluate", "--temperatures", "0", "--seed", "3", *NOWHERE],
        "--seed only applies to sampled",
    ),
    (
        ["evaluate", "--temperatures", "0", "--top-p", "0.9", *NOWHERE],
        "--top-p only applies to sampled",
    ),
    (["evaluate", "--top-p", "2", *NOWHERE], "--top-p: top_p must be in [0, 1]"),
    (["evaluate", "--top-k", "-1", *NOWHERE], "--top-k: top_k must be an int >= 0"),
    (["chat", "qwen3-4bb"], "did you mean qwen3-4b"),
    (["chat", "--drafter", "/no/such/drafter", "--offline"], "/no/such/drafter"),
    (["chat", "--target", "/no/such/dir", "--drafter", "x/y"], "no such folder"),
    (["chat", "--bogus"], "No such option"),
    # mlx-lm's flags: what to write here (click's spelling match said --model-name for --model)
    (["serve", "--model", "x/y"], "--model (mlx-lm's); here: give the model as the argument"),
    (["chat", "--draft-model", "x/y"], "here: --drafter takes a DFlash / DFlash2 drafter"),
    (["serve", "--decode-concurrency", "4"], "here: --max-batch N"),
    (["serve", "--allowed-origins", "*"], "here: --cors ORIGIN"),
    (["bench", "--num-draft-tokens", "3"], "here: --block N verifies N tokens a round"),
    (["frobnicate"], "No such command"),
    (["pull"], "give a MODEL alias"),
    (["pull", "nosuchmodel"], "unknown model"),
    (["models", "extra-arg"], "unexpected extra argument"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_user_mistakes_are_one_line_exit_2(argv, message, capsys):
    assert run(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), cap.err
    assert message.lower() in lines[0].lower()
    assert "Traceback" not in cap.err + cap.out


def test_an_empty_api_key_in_the_environment_is_refused(monkeypatch, capsys):
    """DFLASH2_API_KEY="" (an env file whose secret was left blank) served with no key at
    all: click reads an empty value as unset. Refused, as --api-key '' is."""
    monkeypatch.setenv("DFLASH2_API_KEY", "")
    # (a target that does not exist: were the key let through, that would be the error)
    assert run(["serve", "--target", "/no/such/dir", "--drafter", "x/y"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: DFLASH2_API_KEY is set but empty: give the key, or unset it to serve without one"
    )


def test_a_port_taken_while_the_model_loads_is_one_line():
    """Two servers started at once on one port both bind it (SO_REUSEADDR, before their models
    load); the one that listens second stops with one line, before it says it serves (it
    crashed in uvicorn with a hundred lines of tracebacks). Where the second bind already
    fails (BSD), that is the same line, earlier."""
    from dflash2_cli.common import UserError
    from dflash2_cli.serve import _bind, _listen

    first = _bind("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        try:
            second = _bind("127.0.0.1", port)
        except UserError as early:
            assert str(early).startswith(f"cannot listen on 127.0.0.1:{port}: ")
            return
        first.listen(8)
        with pytest.raises(UserError, match="taken while the model loaded"):
            _listen(second, "127.0.0.1", port)
        assert second.fileno() == -1  # closed
    finally:
        first.close()


def test_a_stream_closed_at_start_writes_nowhere(monkeypatch):
    """`dflash2 serve >&-`: Python makes sys.stdout None, and uvicorn's log formatter asked it
    isatty() after the model had loaded. The CLI gives such a stream the null device."""
    from dflash2_cli.terminal import locale_streams

    monkeypatch.setattr(sys, "stdout", None)
    locale_streams()
    assert sys.stdout is not None and not sys.stdout.isatty()
    print("goes nowhere", flush=True)
    sys.stdout.close()


def test_console_script_error_has_no_traceback():
    for argv in (["chat", "--temp", "abc"], ["chat", "--top-p", "2"]):
        out = subprocess.run(
            [sys.executable, "-m", "dflash2_cli.app", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith("error: ") and len(out.stderr.strip().splitlines()) == 1
        assert "Traceback" not in out.stderr


def _without_root_bypass() -> list[str]:
    """A command prefix under which file permissions apply (root's are dropped by setpriv)."""
    if os.geteuid() != 0:
        return []
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot apply")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("command", ["chat", "bench"])
def test_a_model_folder_one_may_not_open_is_one_line(tmp_path, command):
    """chmod 000 on the model folder: Path.is_file raises PermissionError there (Python
    3.11): one line naming the file, exit 2, no traceback."""
    from tiny_pair import save_pair

    target, drafter = save_pair(tmp_path)
    target.chmod(0)
    argv = [command, "--target", str(target), "--drafter", str(drafter), "--max-tokens", "4"]
    argv += ["-p", "hi"] if command == "chat" else ["--limit", "1", "--no-plot"]
    try:
        out = subprocess.run(
            [*_without_root_bypass(), sys.executable, "-m", "dflash2_cli.app", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        target.chmod(0o755)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr, out.stderr
    assert last == f"error: {target / 'config.json'}: Permission denied", out.stderr


# ------------------------------------------------------------------ models and pull
@pytest.fixture
def caches(hf_offline, dflash2_home):
    fake_hf_repo(hf_offline, "z-lab/Qwen3-4B-DFlash-b16")
    return hf_offline


def test_models_lists_aliases_and_caches(caches, capsys):
    assert run(["models", "--json"]) == 0
    inv = json.loads(capsys.readouterr().out)
    rows = {r["alias"]: r for r in inv["aliases"]}
    assert rows["qwen3-4b"]["drafter_local"] and not rows["qwen3-4b"]["target_local"]
    assert rows["qwen3.8-27b-bf16"]["block_sizes"][0] == 8
    assert [r["repo"] for r in inv["hf_cache"]["repos"]] == ["z-lab/Qwen3-4B-DFlash-b16"]
    assert inv["hf_cache"]["dir"] == str(caches)
    assert run(["models"]) == 0
    out = capsys.readouterr().out
    for text in (
        "qwen3.8-27b-4bit",
        "z-lab/Muse-Glimmer-30B-DFlash2",
        "smollm2-135m",
        "z-lab/Qwen3-4B-DFlash-b16",
        "Hugging Face cache",
        "dflash2 cache",
    ):
        assert text in out
    assert "[green]" not in out and "[dim]" not in out and "✓" in out  # marks, not markup


def test_pull_offline_is_a_clear_error(caches, capsys):
    assert run(["pull", "qwen3-4b"]) == 2
    err = capsys.readouterr().err
    assert (
        "not in the local Hugging Face cache; HF_HUB_OFFLINE is set, so the hub is not asked: unset it"
        in err
    )
    assert "Traceback" not in err


def test_a_mistyped_local_path_is_named_as_one(caches, tmp_path, monkeypatch, capsys):
    """`--target pair/targt` where pair/ exists: looked for on the hub as a repo id too, and
    the error says the folder has no such entry, not only that the hub cache lacks it."""
    (tmp_path / "pair").mkdir()
    monkeypatch.chdir(tmp_path)
    assert run(["pull", "--target", "pair/targt", "--drafter", "pair/drft"]) == 2
    err = capsys.readouterr().err
    assert "pair/targt: no such folder in pair, and not in the local Hugging Face cache" in err
    assert run(["pull", "--target", "org/model", "--drafter", "org/drafter"]) == 2
    assert "org/model: not in the local Hugging Face cache" in capsys.readouterr().err


def test_pull_local_pair(tiny_pair, tmp_path, capsys):
    target, drafter = tiny_pair
    assert run(["pull", "--target", str(target), "--drafter", str(drafter)]) == 0
    out = capsys.readouterr().out
    assert "local folder" in out and "ready: dflash2 chat" in out
    # a folder that holds no model is not "ready"
    assert run(["pull", "--target", str(tmp_path), "--drafter", str(drafter)]) == 2
    assert f"{tmp_path}: config.json is missing" in capsys.readouterr().err


def test_embedded_default_without_drafter(tmp_path, monkeypatch, capsys):
    from dflash2_mlx import registry

    monkeypatch.setattr(registry, "EMBEDDED_DRAFTER", tmp_path / "missing")
    for argv in (["pull", "smollm2-135m"], ["chat", "--prompt", "hi"], ["chat", "default"]):
        assert run(argv) == 2
        assert "the embedded drafter is not built yet" in capsys.readouterr().err


# ------------------------------------------------------------------ chat --prompt
def _chat(pair, *extra) -> list[str]:
    target, drafter = pair
    return ["chat", "--target", str(target), "--drafter", str(drafter), *extra]


def test_stats_after_clear_show_an_empty_conversation(tiny_pair):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "dflash2_cli", *_chat(tiny_pair, "--max-tokens", "4")],
        input="hello model\n/stats\n/clear\n/stats\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    sizes = re.findall(r"context\s+([\d,]+) of", done.stdout + done.stderr)
    assert len(sizes) == 2 and int(sizes[0]) > 0 and sizes[1] == "0", done.stdout + done.stderr


def test_chat_prompt_prints_answer_and_stats(tiny_pair, capsys):
    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 10)
    assert run(_chat(tiny_pair, "--prompt", "hello model", "--max-tokens", "10")) == 0
    cap = capsys.readouterr()
    assert cap.out == expected + "\n" and expected.strip()
    stats = cap.err.strip().splitlines()[-1]
    assert "sampling: greedy (default)" in cap.err  # what a --prompt answer samples with
    for part in ("tok/s", "τ ", "(last ", "block 8", "draft ", "verify ", "10 tok", "length"):
        assert part in stats, stats
    # plain decoding gives the same text (lossless), and a smaller block too
    assert run(_chat(tiny_pair, "-p", "hello model", "--max-tokens", "10", "--no-spec")) == 0
    cap = capsys.readouterr()
    assert cap.out == expected + "\n" and "spec off" in cap.err
    assert run(_chat(tiny_pair, "-p", "hello model", "--max-tokens", "10", "--block", "3")) == 0
    cap = capsys.readouterr()
    assert cap.out == expected + "\n" and "block 3" in cap.err
    # context lookup is on by default (said on load); --lookup 0 / 1 give the same text
    assert "context lookup: after a repeat of the last 3 tokens" in cap.err
    for n in ("0", "1"):
        assert run(_chat(tiny_pair, "-p", "hello model", "--max-tokens", "10", "--lookup", n)) == 0
        cap = capsys.readouterr()
        assert cap.out == expected + "\n"
        assert ("context lookup" in cap.err) == (n != "0")


def test_piped_chat_writes_answers_alone_to_stdout(tiny_pair):
    """A real process, stdin a pipe: no prompts, statuses or command output among the answers
    (they go to stderr, one line each); on/off arguments in any case."""
    import subprocess
    import sys

    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 10)
    slashed = answer(*tiny_pair, [{"role": "user", "content": "/usr is where?"}], 10)
    script = "hello model\n/clear\n/spec OFF\nhello model\n  /clear\n//usr is where?\n/quit\n"
    done = subprocess.run(
        [sys.executable, "-m", "dflash2_cli", *_chat(tiny_pair, "--max-tokens", "10")],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # lossless with spec off too; "//" sends a message that starts with "/"
    assert done.stdout == f"{expected}\n{expected}\n{slashed}\n"
    assert "conversation cleared" in done.stderr and "speculative decoding off" in done.stderr
    assert "spec off" in done.stderr.splitlines()[-1] and ">>>" not in done.stdout + done.stderr


def test_a_piped_chat_file_with_a_byte_order_mark_sends_the_text_alone(tiny_pair):
    """A turns file saved by Notepad: the mark went to the model with the first line."""
    import subprocess
    import sys

    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 10)
    done = subprocess.run(
        [sys.executable, "-m", "dflash2_cli", *_chat(tiny_pair, "--max-tokens", "10")],
        input="\ufeffhello model\n".encode(),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"{expected}\n"


def _with_context(model: Path, folder: Path, context: int) -> Path:
    """A copy of `model` whose config says its context is `context` tokens."""
    import shutil

    shutil.copytree(model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    return folder


def _piped_chat(target: Path, drafter: Path, lines: list[str], max_tokens: int = 10):
    """`dflash2 chat` with `lines` piped in, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "dflash2_cli", "chat", "--target", str(target)]
        + ["--drafter", str(drafter), "--max-tokens", str(max_tokens)],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_piped_chat_killed_mid_answer_still_says_where_it_stopped(tiny_pair):
    """SIGTERM while a piped answer streams: exit 143, and stderr ends with the answer's status
    line, "stopped" (it used to end at the banner)."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash2_cli", *_chat(tiny_pair, "--max-tokens", "100000")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdin.write("hello model\n")
    proc.stdin.flush()
    assert proc.stdout.read(1)  # the answer streams
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "tok/s" in err.splitlines()[-1] and "stopped" in err.splitlines()[-1], err


def test_a_long_message_in_a_full_chat_keeps_the_turns_that_still_fit(tiny_pair, tmp_path):
    """Where a message is too long to free a quarter of the context more even with every
    turn gone, only the turns it needs are dropped (here 2 of 3), not all of them."""
    target = _with_context(tiny_pair[0], tmp_path / "target", 100)
    done = _piped_chat(target, tiny_pair[1], ["hello model", "hello again", "and again", "x " * 64])
    assert done.returncode == 0, done.stderr
    assert "its 2 oldest turns were dropped" in done.stderr, done.stderr


def test_a_full_chat_drops_its_oldest_turns_and_a_message_too_long_loses_nothing(
    tiny_pair, tmp_path
):
    """An answer that filled the context left every later message refused (only /clear went
    on). Now the oldest turns go, said in a note, and a message too long for any conversation
    is refused without dropping them."""
    target = _with_context(tiny_pair[0], tmp_path / "target", 60)
    users = ["hello model", "hello again", "and again", "once more", "x " * 80, "last one"]
    done = _piped_chat(target, tiny_pair[1], users)
    assert done.returncode == 2, done.stderr  # the long line was refused
    answers = done.stdout.split("\n")[:-1]
    assert len(answers) == 5, done.stdout
    # turns 1 and 2 go at once (a quarter of the context is freed), so the last turn, which
    # then needs no drop, reuses the cached conversation instead of prefilling it again
    assert done.stderr.count("context: its 2 oldest turns were dropped (/clear starts anew)") == 1
    assert "oldest turn was dropped" not in done.stderr
    new, reused = re.search(
        r"prompt (\d+) new \+ (\d+) reused", done.stderr.splitlines()[-1]
    ).groups()
    assert int(reused) > int(new), done.stderr
    assert "the prompt is 85 tokens and the model's context 60: shorten it" in done.stderr
    turns = [
        m
        for u, a in zip(users[2:4], answers[2:4])
        for m in ({"role": "user", "content": u}, {"role": "assistant", "content": a})
    ]  # turns 1 and 2 dropped, turns 3 and 4 kept through the refused line
    last = turns + [{"role": "user", "content": users[-1]}]
    assert answers[-1] == answer(target, tiny_pair[1], last, 10)
    # a --max-tokens near the context keeps a short conversation: the answer is cut instead
    done = _piped_chat(target, tiny_pair[1], ["hi", "/max 50", "hello"], max_tokens=4)
    assert done.returncode == 0, done.stderr
    assert "dropped" not in done.stderr and "this answer is limited to" in done.stderr


def test_what_a_chat_line_takes_for_a_command():
    """A known command after spaces is one (it used to go to the model); other text that
    starts with spaces and a slash stays text, and "//" sends a "/"."""
    from dflash2_cli.chat_commands import is_command

    assert is_command("/temp 1") and is_command("  /temp 0.5") and is_command(" /EXIT")
    assert is_command("/nonsense")  # at the line's start: an unknown command's error
    assert not is_command("//x") and not is_command("  /usr/bin is where?")
    assert not is_command("hi /temp")
    # a pasted block of lines is the user's text, sent whole: never a command, never unescaped
    from dflash2_cli.chat_commands import sent_text

    paste = "/usr/local/bin/tool --flag\nWhat does this command do?"
    code = "// add two numbers\nint add(int a, int b) { return a + b; }"
    assert not is_command(paste) and not is_command(code) and not is_command("/temp 1\n/max 3")
    assert sent_text(code) == code and sent_text(paste) == paste
    assert sent_text("//x") == "/x" and sent_text("//x\n") == "/x\n" and is_command("/temp 1\n")


def test_a_chat_started_plain_keeps_its_drafting_flags_for_spec_on(tiny_pair):
    """`--no-spec` beside `--block` / `--lookup` in a chat: /spec on drafts with them."""
    import subprocess
    import sys

    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 10)
    args = _chat(tiny_pair, "--max-tokens", "10", "--no-spec", "--block", "3", "--lookup", "2")
    done = subprocess.run(
        [sys.executable, "-m", "dflash2_cli", *args],
        input="hello model\n/clear\n/spec on\n/block\nhello model\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{expected}\n{expected}\n"
    assert (
        "block 3 (trained 8)" in done.stderr
        and "context lookup: after a repeat of the last 2" in done.stderr
    )
    assert "block 3 │" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize("ending", ["", "/exit\n"])
def test_a_piped_line_that_is_not_utf8_or_a_bad_command_is_refused_and_the_chat_goes_on(
    tiny_pair, ending
):
    """Strict UTF-8 stdin (a macOS terminal's locale): a stray byte is one refused line, not a
    traceback that ends the conversation; a command given an argument it takes none of is
    refused; the script exits 2 for them (whether its input ends or it says /exit), its good
    lines answered."""
    import os
    import subprocess
    import sys

    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 10)
    done = subprocess.run(
        [sys.executable, "-m", "dflash2_cli", *_chat(tiny_pair, "--max-tokens", "10")],
        input=b"hello \xff model\n/clear now\nhello model\n" + ending.encode(),
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "the line is not valid UTF-8 (byte 0xff) at character 6; nothing was sent" in err
    assert "/clear takes no argument, got 'now'" in err and "Traceback" not in err
    assert done.stdout.decode() == expected + "\n"


def test_a_template_error_is_one_line_and_the_chat_goes_on(tiny_pair, tmp_path):
    """A template that refuses a system prompt: that turn is an error line, the next works."""
    import shutil
    import subprocess
    import sys

    target = tmp_path / "target"
    shutil.copytree(tiny_pair[0], target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    save_tokenizer(
        target,
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ m['content'] }} {% endfor %}",
    )
    script = "/system be brief\nhello model\n/system -\nhello model\n"
    args = ["chat", "--target", str(target), "--drafter", str(tiny_pair[1]), "--max-tokens", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "dflash2_cli", *args],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr  # piped: a failed line is the script's to see
    assert "error: the chat template failed: " in done.stderr and "System role" in done.stderr
    assert done.stdout.strip() and "Traceback" not in done.stderr


def test_ctrl_c_stops_a_long_prefill_between_its_chunks(tiny_pair, capsys, monkeypatch):
    """Ctrl-C (the stop flag) is polled between prefill chunks: a long prompt stops before
    its first token instead of prefilling on (exit 130, nothing printed)."""
    import dflash2_cli.chat_repl as repl
    from dflash2_cli.stop_flag import StopFlag

    class Pressed(StopFlag):
        def __enter__(self):
            super().__enter__()
            self.set = True  # Ctrl-C as the turn begins
            return self

    monkeypatch.setattr(repl, "StopFlag", Pressed)
    long = " ".join(["hello model"] * 400)  # > 512 tokens: more than one prefill chunk
    assert run(_chat(tiny_pair, "-p", long, "--max-tokens", "10")) == 130
    cap = capsys.readouterr()
    assert cap.out.strip() == ""
    # the status says what it was doing (it read "prompt 0 new + 0 reused")
    assert re.search(r"stopped in the prefill of \d{3},?\d* prompt tokens", cap.err), cap.err


def test_an_eof_error_is_an_error_not_a_ctrl_c(tiny_pair, capsys, monkeypatch):
    """click turns an EOFError raised anywhere into its Abort, as for Ctrl-C: it once left
    exit 130 and an empty line for a truncated file."""
    import dflash2_cli.chat_run as chat_run

    def truncated(*_a, **_k):
        raise EOFError("no data left in the file")

    monkeypatch.setattr(chat_run, "load_engine", truncated)
    assert run(_chat(tiny_pair, "-p", "hello", "--max-tokens", "4")) == 1
    assert "unexpected end of data: no data left in the file" in capsys.readouterr().err


def test_ctrl_c_ends_a_piped_chat(tiny_pair, capsys, monkeypatch):
    """Lines piped in: Ctrl-C stops the answer and the script (exit 130), not only the
    answer as in a terminal; the lines after it are not sent."""
    import io

    import dflash2_cli.chat_repl as repl
    from dflash2_cli.stop_flag import StopFlag

    turns = []

    class Pressed(StopFlag):
        def __enter__(self):
            super().__enter__()
            turns.append(1)
            self.set = True  # Ctrl-C as the turn begins
            return self

    monkeypatch.setattr(repl, "StopFlag", Pressed)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello model\nsecond line\n"))
    assert run(_chat(tiny_pair, "--max-tokens", "10")) == 130
    assert len(turns) == 1 and "stopped" in capsys.readouterr().err


def test_chat_repetition_penalty_is_plain_decoding_with_it(tiny_pair, capsys):
    """--repetition-penalty: the answer is mlx-lm's plain greedy decoding with its processor."""
    import dflash2_mlx as d2
    from test_processors import mlx_lm_reference

    from dflash2_mlx.text import chat_prompt_ids, generate_text

    pair = d2.load_pair(*tiny_pair)
    ids = chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": "hello model"}])
    procs = d2.penalties(pair.decoder.target.vocab_size, repetition_penalty=3.0)
    want = mlx_lm_reference(pair.model, ids, 10, procs)
    assert want != mlx_lm_reference(pair.model, ids, 10, ()), "the penalty should matter"
    result = generate_text(pair, ids, d2.GenerationParams(max_tokens=10, logits_processors=procs))
    assert result.tokens == want[: len(result.tokens)] and result.text.strip()
    argv = _chat(tiny_pair, "-p", "hello model", "--max-tokens", "10", "--repetition-penalty", "3")
    assert run(argv) == 0
    assert capsys.readouterr().out == result.text + "\n"


def test_chat_thinking_budget_runs_as_the_library_does(tiny_pair, capsys):
    """--thinking-budget N: the answer is the library's generation under the same budget."""
    import dflash2_mlx as d2
    from dflash2_mlx.engine.budget import ThinkingBudget
    from dflash2_mlx.text import chat_prompt_ids, generate_text

    pair = d2.load_pair(*tiny_pair)
    ids = chat_prompt_ids(pair.tokenizer, [{"role": "user", "content": "hello model"}])
    vocab = pair.decoder.target.vocab_size
    budget = ThinkingBudget.for_prompt(pair.tokenizer, ids, 2, vocab)
    want = generate_text(pair, ids, d2.GenerationParams(max_tokens=10, constraint=budget)).text
    argv = _chat(tiny_pair, "-p", "hello model", "--max-tokens", "10", "--thinking-budget", "2")
    assert run(argv) == 0
    assert capsys.readouterr().out == want + "\n"
    empty = ThinkingBudget.for_prompt(pair.tokenizer, ids, 0, vocab)  # 0: an empty section
    want = generate_text(pair, ids, d2.GenerationParams(max_tokens=10, constraint=empty)).text
    assert run(argv[:-1] + ["0"]) == 0 and capsys.readouterr().out == want + "\n"
    assert run(_chat(tiny_pair, "-p", "hi", "--thinking-budget", "-1")) != 0


def test_chat_with_a_draft_vocabulary_and_full_vocab(tiny_pair, tmp_path, capsys):
    """A drafter folder with draft_vocab.json drafts from it (said on load); --full-vocab turns
    it off, --draft-vocab N keeps its N most frequent ids; the answer is the same text every
    way; contradictions and a limit below the selector's top-K are refused."""
    import shutil
    from collections import Counter

    from dflash2_mlx.drafter.vocab import write_draft_vocab

    target, drafter = tiny_pair
    shutil.copytree(drafter, tmp_path / "d")
    write_draft_vocab(tmp_path / "d", Counter(range(0, 64)), "test")
    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 10)
    pair = (target, tmp_path / "d")
    assert run(_chat(pair, "--prompt", "hello model", "--max-tokens", "10")) == 0
    cap = capsys.readouterr()
    assert cap.out == expected + "\n" and "draft vocabulary: 64 of 96 tokens" in cap.err
    assert run(_chat(pair, "--prompt", "hello model", "--max-tokens", "10", "--full-vocab")) == 0
    cap = capsys.readouterr()
    assert cap.out == expected + "\n" and "draft vocabulary" not in cap.err
    assert (
        run(_chat(pair, "--prompt", "hello model", "--max-tokens", "10", "--draft-vocab", "20"))
        == 0
    )
    cap = capsys.readouterr()
    assert cap.out == expected + "\n" and "draft vocabulary: 20 of 96 tokens" in cap.err
    code = run(_chat(pair, "-p", "hi", "--draft-vocab", "20", "--full-vocab"))
    assert code != 0 and "--draft-vocab and --full-vocab contradict" in capsys.readouterr().err
    assert run(_chat(pair, "-p", "hello model", "--max-tokens", "10", "--draft-vocab", "500")) == 0
    cap = capsys.readouterr()  # more than the file lists: all of it, and it says so
    assert cap.out == expected + "\n"
    assert "64 of 96 tokens (--draft-vocab 500: the drafter lists only 64;" in cap.err
    code = run(_chat(pair, "-p", "hi", "--draft-vocab", "8"))  # the selector ranks 16
    assert code != 0 and "it must be at least 16" in capsys.readouterr().err


def test_chat_prompt_thinking_and_system(tiny_pair, capsys):
    msgs = [{"role": "system", "content": "be fast"}, {"role": "user", "content": "why"}]
    expected = answer(*tiny_pair, msgs, 6, thinking=False)
    argv = _chat(
        tiny_pair,
        "-p",
        "why",
        "--system",
        "be fast",
        "--no-thinking",
        "--max-tokens",
        "6",
        "--temp",
        "0",
        "--top-k",
        "5",
    )
    assert run(argv) == 0
    cap = capsys.readouterr()
    assert cap.out == expected + "\n"
    assert "top_k has no effect at temperature 0" in cap.err  # never silently ignored


def test_a_prompt_cut_inside_its_thinking_ends_that_line(tiny_pair, capsys):
    """-p with a reply cut inside its thinking (which goes to stderr): the status starts a
    line of its own, not after the last thinking words."""
    from tiny_pair import CHAT_TEMPLATE

    opened = CHAT_TEMPLATE.replace(
        "{% endif %}{% endif %}", "{% else %}<think> {% endif %}{% endif %}"
    )
    argv = _chat(tiny_pair, "-p", "why", "--max-tokens", "3", "--chat-template", opened)
    assert run(argv) == 0
    cap = capsys.readouterr()
    assert cap.out == "\n"  # no answer: all three tokens were thinking
    status = next(line for line in cap.err.splitlines() if "tok/s" in line)
    assert status.split()[0].replace(".", "").isdigit(), cap.err


def test_chat_errors_after_loading(tiny_pair, tmp_path, capsys):
    target, drafter = tiny_pair
    assert run(_chat(tiny_pair, "-p", "hi", "--block", "99")) == 2
    assert "exceeds the drafter's trained block size 8" in capsys.readouterr().err
    assert run(["chat", "--target", str(drafter), "--drafter", str(drafter), "-p", "hi"]) == 2
    err = capsys.readouterr().err
    assert "is a DFlash drafter, not a target model" in err and "Traceback" not in err
    assert [len(line) < 300 for line in err.splitlines() if "error:" in line] == [True], err
    assert run(["chat", "--target", str(target), "--drafter", str(target), "-p", "hi"]) == 2
    err = capsys.readouterr().err
    assert f"error: {target} is a llama model, not a DFlash drafter" in err, err


def test_chat_thinking_switch_needs_a_template_that_has_one(tmp_path, tiny_pair, capsys):
    import shutil

    target = tmp_path / "plain"
    shutil.copytree(tiny_pair[0], target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    save_tokenizer(target, "{% for m in messages %}{{ m['content'] }} {% endfor %}")
    # its tokenizer has thinking markers: with no switch, the model always thinks
    pair = ["--target", str(target), "--drafter", str(tiny_pair[1]), "--no-thinking"]
    assert run(["chat", *pair, "-p", "hi"]) == 2
    assert "no thinking switch and it always thinks" in capsys.readouterr().err
    # on is what it does anyway: taken, as a request's enable_thinking true is (a launcher
    # that always passes --no-thinking could not start a model that never thinks)
    assert run(["chat", *pair[:-1], "--thinking", "-p", "hi", "--max-tokens", "2"]) == 0
    bench = ["bench", *pair, "--limit", "1", "--max-tokens", "4", "--repeats", "1", "--no-plot"]
    assert run(bench) == 2  # bench too: the flag would have been ignored
    assert (
        "--no-thinking: this model's chat template has no thinking switch"
        in capsys.readouterr().err
    )
    # a bare /thinking shows the setting, which is no failure (a piped script exits 0);
    # /thinking on is one (exit 2)
    chat = [sys.executable, "-m", "dflash2_cli", "chat", *pair[:-1]]
    for script, code in (("/thinking\n", 0), ("/thinking off\n", 2)):  # it always thinks
        done = subprocess.run(chat, input=script, capture_output=True, text=True, timeout=120)
        assert done.returncode == code, (script, done.stderr)
        assert "no thinking switch" in done.stderr


def test_bench_refuses_a_context_past_the_models_before_measuring(tiny_pair, capsys):
    """--context deeper than the model's context: one line naming it, before any prompt runs
    (it once prefilled 100M tokens until memory ran out)."""
    import json

    from dflash2_cli.app import run

    config = json.loads((tiny_pair[0] / "config.json").read_text())
    limit = config.get("max_position_embeddings", 4096)  # default_context_length's rule
    pair = ["--target", str(tiny_pair[0]), "--drafter", str(tiny_pair[1])]
    common = ["--limit", "1", "--max-tokens", "4", "--repeats", "1", "--no-plot"]
    for extra in ([], ["--autotune"]):
        assert run(["bench", *pair, *common, "--context", str(limit), *extra]) == 2
        captured = capsys.readouterr()
        assert f"exceed the model's context ({limit} tokens)" in captured.err, captured.err
        assert f"error: --context: {limit} tokens" in captured.err, captured.err
        assert "tok/s" not in captured.out + captured.err  # nothing was measured


def test_sparkline_and_status_line():
    from collections import Counter

    from dflash2_cli.chat_view import sparkline, status_text
    from dflash2_mlx import GenerationStats, RoundEvent

    assert sparkline(Counter({1: 4, 3: 1, 8: 2}), 8) == "█·▂····▄"
    assert sparkline(Counter(), 4) == "····"
    stats = GenerationStats()
    stats.add(
        RoundEvent(tokens=[5], prefill_ms=3.0, prefill=True, prompt_tokens=7, reused_tokens=20)
    )
    for accepted in (3, 0, 3):
        stats.add(
            RoundEvent(
                tokens=[1] * (accepted + 1),
                drafted=3,
                accepted=accepted,
                block_size=4,
                draft_ms=2.0,
                verify_ms=4.0,
            )
        )
    line = status_text(stats, block=4, spec=True, finish="length").plain
    assert "τ 3.00 (last 4)" in line and "▄··█" in line and "10 tok" in line and "block 4" in line
    assert "draft 2.0 · verify 4.0 ms/round" in line and "prompt 7 new + 20 reused" in line
    assert "spec off" in status_text(stats, block=1, spec=False).plain


def test_rounds_above_the_block_are_drawn():
    """A context-lookup round can commit up to 16 tokens at block 4: the sparkline's last
    character counts block or more, /stats lists the count as it is."""
    from collections import Counter

    from rich.console import Console

    from dflash2_cli.chat_view import sparkline, stats_table, status_text
    from dflash2_mlx import GenerationStats, RoundEvent

    assert sparkline(Counter({16: 1}), 4) == "···█"
    assert sparkline(Counter({1: 2, 4: 1, 16: 1}), 4) == "█··█"
    assert sparkline(Counter({1: 4, 6: 1, 9: 1}), 4) == "█··▄"
    stats = GenerationStats()
    stats.add(RoundEvent(tokens=[1] * 16, drafted=15, accepted=15, block_size=16, source="lookup"))
    assert "│ ···█ │ block 4" in status_text(stats, block=4, spec=True).plain
    stats.add(RoundEvent(tokens=[1, 2], drafted=3, accepted=1, block_size=4))
    console = Console(record=True, width=120)
    console.print(stats_table(stats, 1, (0, 8192), {}, 4))
    rows = {
        line.split()[0]: line.split()[1:]
        for line in console.export_text().splitlines()
        if line.split() and line.split()[0].isdigit()
    }
    assert rows["16"][0] == "1" and rows["2"][0] == "1" and rows["4"] == ["0"]
    assert "5" not in rows and "15" not in rows  # no empty rows between the block and 16


def test_evaluate_writes_tau_per_setting_and_category(tiny_pair, tmp_path, capsys):
    target, drafter = tiny_pair
    out = tmp_path / "tau.json"
    assert (
        run(
            [
                "evaluate",
                "--target",
                str(target),
                "--drafter",
                str(drafter),
                "--limit",
                "3",
                "--max-tokens",
                "6",
                "--blocks",
                "2,4",
                "--temperatures",
                "0,1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["draft_vocab"] is None and report["command"].startswith("dflash2 ")
    assert report["schema"] == "dflash2.evaluate/1" and report["created"]
    res = report["results"]
    assert sorted(res) == ["T=0/B=2", "T=0/B=4", "T=1/B=2", "T=1/B=4"]
    for r in res.values():
        assert 1.0 <= r["tau"] <= 4.0 and r["per_category"]
    cap = capsys.readouterr()
    shown = cap.out
    assert "T=0/B=4" in shown and f"results:{out}" in "".join(shown.split())  # wrapped or not
    # not a terminal: a progress line at each quarter of the 12 generations, on stderr
    assert [line for line in cap.err.splitlines() if line.startswith("evaluated")] == [
        f"evaluated {n}/12 generations" for n in (3, 6, 9, 12)
    ]


def test_evaluate_samples_with_the_filters_given(tiny_pair, tmp_path, monkeypatch):
    """τ at a model's own sampling settings (Qwen3's top_k 20, top_p 0.95): every sampled run
    takes --top-p / --top-k, and the JSON records them."""
    from dflash2_mlx.api import Pair

    seen, stream = set(), Pair.stream

    def recording(self, ids, params, *args, **kwargs):
        seen.add((params.sampling.temperature, params.sampling.top_k, params.sampling.top_p))
        return stream(self, ids, params, *args, **kwargs)

    monkeypatch.setattr(Pair, "stream", recording)
    target, drafter = tiny_pair
    out = tmp_path / "tau.json"
    argv = ["evaluate", "--target", str(target), "--drafter", str(drafter), "--limit", "1"]
    argv += ["--max-tokens", "4", "--blocks", "2", "--temperatures", "0,0.6", "--top-k", "20"]
    assert run([*argv, "--top-p", "0.95", "--json", str(out)]) == 0
    assert seen == {(0.0, 20, 0.95), (0.6, 20, 0.95)}
    assert json.loads(out.read_text())["filters"] == {"top_p": 0.95, "top_k": 20}


@pytest.mark.parametrize("blocks", ["16,100", "2,99"])
def test_evaluate_refuses_blocks_above_the_trained_size(tiny_pair, tmp_path, blocks, capsys):
    """As chat's and bench's --block: refused, naming --blocks and the trained size (not an
    empty table, `"results": {}` and exit 0, nor a silent hole in the results)."""
    target, drafter = tiny_pair
    out = tmp_path / "tau.json"
    argv = ["evaluate", "--target", str(target), "--drafter", str(drafter), "--blocks", blocks]
    assert run([*argv, "--limit", "1", "--max-tokens", "2", "--json", str(out)]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert lines[-1].startswith("error: --blocks must be 1 .. 8: ")
    assert "exceeds the drafter's trained block size 8" in lines[-1]
    assert "Traceback" not in cap.err and not out.exists() and "setting" not in cap.out


def test_evaluate_default_blocks_stop_at_the_trained_size():
    from dflash2_mlx.train.evaluate import default_blocks

    assert default_blocks(8) == (4, 8) and default_blocks(16) == (4, 8, 16)
    assert default_blocks(12) == (4, 8, 12) and default_blocks(2) == (2,)


def test_stats_and_tables_show_brackets_as_written():
    """A system prompt "[/INST]" or a category "[code]" is text in the /stats and bench
    tables, not Rich markup (which would drop it or crash the session)."""
    from rich.console import Console

    from dflash2_cli.chat_view import stats_table
    from dflash2_mlx import GenerationStats

    console = Console(record=True, width=120)
    settings = {"system": "Reply with [/INST] tags as [name]"}
    console.print(stats_table(GenerationStats(), 0, (0, 8192), settings, 4))
    assert "Reply with [/INST] tags as [name]" in console.export_text()


def test_chat_refuses_a_prompt_past_the_context_and_cuts_the_answer(tiny_pair, capsys):
    """The model's context (max_position_embeddings, 4096 here) bounds prompt + answer, as
    the server's: a prompt that fills it is a one-line error before any prefill; an answer
    that would run past it is cut there, with a note."""
    assert run(_chat(tiny_pair, "--prompt", "hello model " * 3000, "--max-tokens", "4")) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "context 4096" in err and "Traceback" not in err
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_pair[0]))
    n = len(tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True))
    long = "x " * (4096 - n - 40)  # leaves a few tokens for the answer
    assert run(_chat(tiny_pair, "--prompt", long, "--max-tokens", "2000")) == 0
    assert "this answer is limited to" in capsys.readouterr().err


def test_chat_past_the_tokenizer_length_says_only_its_own_error(tiny_pair, tmp_path, capsys):
    """A prompt longer than the tokenizer's model_max_length: transformers' "Token indices
    sequence length is longer than ..." warning does not come before chat's one-line error."""
    import logging
    import shutil

    from transformers import AutoTokenizer

    target = tmp_path / "target"
    shutil.copytree(tiny_pair[0], target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 64}))
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("transformers.tokenization_utils_base")
    logger.addHandler(handler)
    try:
        pair = (target, tiny_pair[1])
        assert run(_chat(pair, "--prompt", "hello model " * 3000, "--max-tokens", "4")) == 2
        err = capsys.readouterr().err
        assert "error: the prompt is" in err and "Token indices" not in err and not seen
        AutoTokenizer.from_pretrained(str(target)).encode("hello model " * 100)
        assert any("Token indices" in m for m in seen)  # the handler does see the warning
    finally:
        logger.removeHandler(handler)


def test_evaluate_json_path_is_checked_before_the_run(tmp_path, capsys):
    """As bench's: a --json path under a file, or a folder, fails at once (no model loaded,
    rather than a traceback after the whole run)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for path in (blocker / "x.json", tmp_path):
        assert run(["evaluate", *NOWHERE, "--json", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --json: cannot write {path}") and "Traceback" not in err
        assert err.count("\n") == 1
        if path != tmp_path:
            assert "a-file is a file, not a folder" in err, err
    if sys.platform == "linux":  # /proc: os.access says yes to root, a write says no
        assert run(["evaluate", *NOWHERE, "--json", "/proc/dflash2-x.json"]) == 2
        assert "/proc is not writable" in capsys.readouterr().err
    # a run that fails after the check leaves no empty folders behind
    assert run(["evaluate", *NOWHERE, "--json", str(tmp_path / "new" / "deep" / "x.json")]) == 2
    assert "--json" not in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_bench_output_paths_are_checked_before_the_run(tmp_path, capsys):
    """A --json or --plot path that cannot be written fails at once (no model loaded)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for flag in ("--json", "--plot"):
        assert run(["bench", flag, str(blocker / "x.out"), "--limit", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag}: cannot write") and "Traceback" not in err


ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def _in_ascii_locale(args: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONIOENCODING"}
    env.update(ASCII_LOCALE)
    return subprocess.run(args, input=stdin, capture_output=True, env=env, timeout=300)


def test_an_ascii_locale_reads_utf8_and_writes_what_it_can():
    """LC_ALL=C with Python's UTF-8 coercion off: a UTF-8 argument or stdin line is read as
    the text it is (it was "not valid UTF-8"), and a character the locale cannot write is a
    "?" (it was a UnicodeEncodeError traceback, the answer lost)."""
    code = (
        "import sys; from dflash2_cli.terminal import argument_text, locale_streams;"
        "locale_streams(); print(ascii(argument_text(sys.argv[1])), ascii(sys.stdin.read()));"
        "print('caf\\u00e9 \\u4f60')"
    )
    out = _in_ascii_locale([sys.executable, "-c", code, "你好"], "café".encode())
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode("ascii").splitlines() == ["'\\u4f60\\u597d' 'caf\\xe9'", "caf? ?"]


def test_chat_in_an_ascii_locale(tiny_pair):
    target, drafter = tiny_pair
    args = [sys.executable, "-m", "dflash2_cli", "chat", "--target", str(target)]
    args += ["--drafter", str(drafter), "--prompt", "你好 café", "--max-tokens", "4"]
    out = _in_ascii_locale(args)
    assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr


def test_a_warning_is_one_line_without_source(tmp_path):
    """The command prints a library warning as `warning: ...`, not Python's file:line and
    code (the BLAS binding warns at import, before any command runs)."""
    env = dict(os.environ, DFLASH2_BLAS="bogus")
    out = subprocess.run(
        [sys.executable, "-m", "dflash2_cli", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stderr.splitlines() if "bogus" in x]
    assert lines and all(x.startswith("warning: ") and ".py:" not in x for x in lines), out.stderr


def test_bracketed_paste_is_left_off_in_a_dumb_terminal(monkeypatch):
    """TERM=dumb (Emacs' shell): readline's bracketed-paste codes would show as text."""
    readline = pytest.importorskip("readline")
    if "libedit" in (readline.__doc__ or ""):
        pytest.skip("libedit keeps its own defaults")
    from dflash2_cli.terminal import line_editing

    bound = []
    monkeypatch.setattr(readline, "parse_and_bind", bound.append)
    monkeypatch.setenv("TERM", "dumb")
    line_editing()
    assert bound == []
    monkeypatch.setenv("TERM", "xterm-256color")
    line_editing()
    assert bound == ["set enable-bracketed-paste on"]


def test_keys_typed_during_an_answer_are_not_echoed_and_are_kept(monkeypatch):
    """While an answer streams the terminal does not echo what is typed ahead (its echo broke
    the live redraw); the line stays in the input buffer for the next prompt."""
    termios = pytest.importorskip("termios")
    pty = pytest.importorskip("pty")
    from dflash2_cli.terminal import keys_unechoed

    master, slave = pty.openpty()
    with open(slave, "r", closefd=True) as tty, open(master, "wb", buffering=0) as keyboard:
        monkeypatch.setattr(sys, "stdin", tty)
        assert termios.tcgetattr(slave)[3] & termios.ECHO
        with keys_unechoed():
            assert not termios.tcgetattr(slave)[3] & termios.ECHO
            keyboard.write(b"typed ahead\n")
        assert termios.tcgetattr(slave)[3] & termios.ECHO
        assert tty.readline() == "typed ahead\n"


def test_serve_warns_of_a_bind_beyond_loopback_without_a_key(capsys):
    """--host 0.0.0.0 (or a LAN address) without --api-key: any program that reaches the
    port can use the model (the Host check stops browsers only), said at start."""
    from dflash2_cli.serve import _policies

    def said(host, key):
        _policies(host, 4.0, None, None, 1.0, None, None, key, None)
        return capsys.readouterr().err

    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", said("0.0.0.0", None))  # timed
    assert "warning: listening on 0.0.0.0 without --api-key" in said("0.0.0.0", None)
    assert "warning: listening on 192.0.2.2 without --api-key" in said("192.0.2.2", None)
    assert "warning" not in said("0.0.0.0", "k") + said("127.0.0.1", None) + said("::1", None)


def test_a_chat_reply_splits_into_its_thinking_and_its_answer(tmp_path):
    """The chat shows a thinking model's first section dimmed and keeps it out of a piped
    answer and out of the turn's content (it goes back as reasoning_content): its markers
    are found whatever the chunks, and markers later in the answer are answer text."""
    import tiny_tools as tt

    from dflash2_cli.chat_thinking import ANSWER, THINKING, ThinkingSplit

    hf = tt._hf_tokenizer(list(tt.vocabulary()))
    hf.chat_template = tt.TEMPLATE
    hf.save_pretrained(str(tmp_path))
    tok = tt.load_tokenizer(tmp_path)
    assert tok.has_thinking
    text = "<think>\nthe user says hi.\n\n</think>\n\nhello <think> there"
    for step in (1, 3, 7, len(text)):
        split = ThinkingSplit(tok, [1])
        pieces = [p for i in range(0, len(text), step) for p in split.feed(text[i : i + step])]
        pieces += split.finish()
        assert split.thinking_text == "the user says hi." and not split.thinking_text.endswith("\n")
        assert split.answer_text == "hello <think> there", step
        for kind, whole in ((THINKING, split.thinking_text), (ANSWER, split.answer_text)):
            assert "".join(t for k, t in pieces if k == kind) == whole
    plain = ThinkingSplit(tok, [1])
    plain.feed("\nhi <think>x</think>")
    plain.finish()
    assert plain.answer_text == "\nhi <think>x</think>" and not plain.thinking_text


@pytest.mark.parametrize("command", ["bench", "evaluate"])
def test_results_never_replace_the_prompts_file_they_read(command, tmp_path, capsys):
    """`--json` naming the `--prompts` file replaced the prompt set with results, silently."""
    from dflash2_cli.app import run

    prompts = tmp_path / "mine.jsonl"
    line = {"id": "a", "category": "chat", "messages": [{"role": "user", "content": "hi"}]}
    prompts.write_text(json.dumps(line) + "\n")
    argv = [command, *NOWHERE, "--prompts", str(prompts), "--json", str(prompts)]
    assert run(argv) == 2
    assert f"--json {prompts} is the --prompts file this run reads" in capsys.readouterr().err
    assert json.loads(prompts.read_text()) == line


def test_a_background_job_leaves_the_terminal_alone(monkeypatch):
    """`dflash2 chat -p ... &`: changing the terminal from the background would stop the job
    (SIGTTOU), so echo is left as it is there; and an ignored SIGHUP (nohup) stays ignored."""
    import os
    import signal

    termios = pytest.importorskip("termios")
    pty = pytest.importorskip("pty")
    from dflash2_cli.terminal import ends_on_hangup, keys_unechoed

    master, slave = pty.openpty()
    with open(slave, "r", closefd=True) as tty, open(master, "wb", buffering=0):
        monkeypatch.setattr(sys, "stdin", tty)
        monkeypatch.setattr(os, "tcgetpgrp", lambda fd: os.getpgrp() + 1)  # another job's
        with keys_unechoed():
            assert termios.tcgetattr(slave)[3] & termios.ECHO
    before, term = signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)
    try:
        with ends_on_hangup():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not term  # that one is handled
    finally:
        signal.signal(signal.SIGHUP, before)


def test_serve_holds_the_standard_descriptors_and_an_ignored_sigint(tmp_path):
    """Started with stdin, stdout and stderr closed, `dflash2 serve`'s listening socket took
    fd 2 (where a C-level error message goes); started by a script's `&` (SIGINT ignored), a
    SIGINT during the model's load was lost. The descriptors are /dev/null's, and SIGINT
    stops the load as it stops the server."""
    import signal

    out = tmp_path / "out.json"
    code = (
        "import json, os, signal, socket, stat\n"
        "from dflash2_cli.serve_run import prepare_process\n"
        "prepare_process()\n"
        "s = socket.socket()\n"
        "json.dump({'fds': [stat.S_ISCHR(os.fstat(fd).st_mode) for fd in (0, 1, 2)],\n"
        "  'socket': s.fileno(), 'sigint': signal.getsignal(signal.SIGINT)\n"
        "  is signal.default_int_handler}, open(os.environ['OUT'], 'w'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        close_fds=True,
        pass_fds=(),
        preexec_fn=lambda: (
            [os.close(fd) for fd in (0, 1, 2)] + [signal.signal(signal.SIGINT, signal.SIG_IGN)]
        ),
        env={**os.environ, "OUT": str(out)},
        timeout=60,
    )
    assert done.returncode == 0
    got = json.loads(out.read_text())
    assert got == {"fds": [True, True, True], "socket": got["socket"], "sigint": True}
    assert got["socket"] > 2
