"""`dflash2 chat` as a person uses it: in a pseudo-terminal, typing, reading the screen.

Drives the real console script (live rich rendering, readline input, SIGINT from the
terminal's Ctrl-C, EOF from Ctrl-D) on a tiny random pair saved to disk.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
from pathlib import Path

import pexpect

from tiny_pair import answer


ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\r")
PROMPT = ">>> "


def screen(text: str) -> str:
    """What was printed, without escape sequences, whitespace (line wraps) squashed."""
    return " ".join(ANSI.sub("", text).split())


def command() -> list[str]:
    script = shutil.which("dflash2", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "dflash2_cli.app"]


STATUS = re.compile(
    r"[\d.]+ tok/s │ τ \d+\.\d\d \(last \d+\) │ [·▁▂▃▄▅▆▇█]{%s} │ block %s │ "
    r"(?:lookup \d+%% │ )?draft [\d.]+ · verify [\d.]+ ms/round │ %s tok │ "
    r"prompt \d+ new \+ (\d+) reused │ %s"
)


def test_chat_in_a_terminal(tiny_pair):
    target, drafter = tiny_pair
    expected = answer(target, drafter, [{"role": "user", "content": "hello model"}], 12)
    exe, *pre = command()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="", LINES="")
    child = pexpect.spawn(
        exe,
        pre + ["chat", "--target", str(target), "--drafter", str(drafter), "--max-tokens", "12"],
        env=env,
        encoding="utf-8",
        dimensions=(40, 160),
        timeout=90,
    )
    try:
        child.expect_exact(PROMPT)
        assert "/help for commands" in screen(child.before)

        # a first turn: the answer streams, then the status line stays on screen
        child.sendline("hello model")
        child.expect_exact(PROMPT)
        shown = screen(child.before)
        assert screen(expected) in shown
        assert "prefilling 7 prompt tokens…" in shown  # the status before the first token
        first = STATUS.pattern % (8, 8, 12, "length")
        assert re.search(first, shown), shown
        assert re.search(first, shown).group(1) == "0"  # nothing to reuse on turn one

        # a second turn re-templates the history; the cache serves the common prefix
        child.sendline("why")
        child.expect_exact(PROMPT)
        reused = re.search(STATUS.pattern % (8, 8, 12, "length"), screen(child.before))
        assert reused and int(reused.group(1)) > 0, screen(child.before)

        # slash commands: good and bad values; the session goes on
        for line, reply in [
            ("/temp 0.5", "temperature = 0.5"),
            ("/block 2", "block = 2"),
            ("/block 99", "error: /block must be 1 .. 8"),
            ("/top_p nope", "error: /top_p needs a number"),
            ("/temp -1", "error: /temp: temperature must be a finite number >= 0, got -1.0"),
            ("/spec sideways", "error: /spec needs on or off, got 'sideways'"),
            ("/max 0", "error: /max must be a number of tokens >= 1, got 0"),
            ("/max", "max tokens = 12"),  # no argument: the current value, as /system
            ("/temp", "temperature = 0.5"),
            ("/thinking", "thinking: the chat template's default (on)"),  # read off it
            ("/thinking off", "thinking off"),
            ("/thinking", "thinking: off"),
            ("/nosuch", "unknown command /nosuch"),
            ("/help", "/spec on|off"),
        ]:
            child.sendline(line)
            child.expect_exact(PROMPT)
            assert reply in screen(child.before), (line, screen(child.before))
        child.sendline("/stats")
        child.expect_exact(PROMPT)
        stats = screen(child.before)
        for text in (
            "turns 2",
            "answer tokens 24",
            "τ (tokens / round)",
            "reused from cache",
            "temperature 0.5",
            "block 2 (trained 8)",
            "tokens committed per round",
        ):
            assert text in stats, (text, stats)

        # Ctrl-C during a long answer stops it and keeps the session
        child.sendline("/max 100000")
        child.expect_exact(PROMPT)
        child.sendline("tell me a long story")
        child.expect("tok/s")  # the live status line: the answer is being generated
        child.expect("tok/s")
        child.sendintr()
        child.expect_exact(PROMPT, timeout=30)
        stopped = screen(child.before)
        assert re.search(STATUS.pattern % (2, 2, r"\d+", "stopped"), stopped), stopped
        assert "Traceback" not in stopped

        # the session survives: a new prompt works and reuses the conversation's cache
        child.sendline("/max 5")
        child.expect_exact(PROMPT)
        child.sendline("hello")
        child.expect_exact(PROMPT)
        after = re.search(STATUS.pattern % (2, 2, 5, "length"), screen(child.before))
        assert after and int(after.group(1)) > 0, screen(child.before)

        # Ctrl-D exits cleanly
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


STYLES = re.compile(r"\x1b\[[0-9;]*m")
CONTROLS = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|[\r\n]")


def test_status_line_fits_an_80_column_terminal(tiny_pair):
    """At 80 columns every frame of the status line, live and final, is one line of at most 80
    characters: fields are abbreviated or dropped (chat_view.NARROWING), never wrapped."""
    target, drafter = tiny_pair
    exe, *pre = command()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="", LINES="")
    child = pexpect.spawn(
        exe,
        pre + ["chat", "--target", str(target), "--drafter", str(drafter), "--max-tokens", "40"],
        env=env,
        encoding="utf-8",
        dimensions=(24, 80),
        timeout=90,
    )
    try:
        child.expect_exact(PROMPT)
        child.sendline("hello model")
        child.expect_exact(PROMPT)
        # what was written between cursor moves and line ends: one screen line each
        pieces = CONTROLS.split(STYLES.sub("", child.before))
        frames = [p.rstrip() for p in pieces if "tok/s" in p]
        assert len(frames) >= 2, pieces  # live frames, then the final one
        assert all(len(f) <= 80 for f in frames), [f for f in frames if len(f) > 80]
        final = r"^ *[\d.]+ tok/s │ τ \d+\.\d\d.* │ [·▁▂▃▄▅▆▇█]{8} │ block 8 │ .*40 tok.* │ length$"
        assert re.match(final, frames[-1]), frames[-1]  # whole: the finish reason is on it
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


def spawn_chat(line: str) -> "pexpect.spawn":
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="", LINES="")
    return pexpect.spawn(
        "bash", ["-c", line], env=env, encoding="utf-8", dimensions=(40, 160), timeout=90
    )


def chat_line(tiny_pair, *extra: str) -> str:
    exe, *pre = command()
    target, drafter = tiny_pair
    args = [exe, *pre, "chat", "--target", str(target), "--drafter", str(drafter), *extra]
    return " ".join(f"'{a}'" for a in args)


def test_a_pasted_text_is_one_message(tiny_pair):
    """A pasted text of several lines (the terminal's bracketed paste, which the chat turns
    on) is one message, answered once."""
    pasted = "hello model\nwhy"
    expected = answer(*tiny_pair, [{"role": "user", "content": pasted}], 6)
    child = spawn_chat(chat_line(tiny_pair, "--max-tokens", "6"))
    try:
        child.expect_exact(PROMPT)
        assert "\x1b[?2004h" in child.before  # the terminal is asked for bracketed paste
        child.send("\x1b[200~" + pasted + "\n\x1b[201~")  # what a terminal sends for a paste
        child.send("\r")
        child.expect_exact(PROMPT)
        assert screen(expected) in screen(child.before)
        child.sendline("/stats")
        child.expect_exact(PROMPT)
        assert "turns 1" in screen(child.before), screen(child.before)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


def test_redirected_answers_stay_clean(tiny_pair, tmp_path):
    """With stdout redirected at a terminal the prompt, hints and command replies stay on
    the terminal, and the file holds the answers alone."""
    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 6)
    out = tmp_path / "answers.txt"
    child = spawn_chat(chat_line(tiny_pair, "--max-tokens", "6") + f" > '{out}'")
    try:
        child.expect_exact(PROMPT)  # on the terminal, though stdout is a file
        child.sendline("hello model")
        child.expect_exact(PROMPT)
        child.sendline("/temp")
        child.expect_exact(PROMPT)
        assert "temperature = 0.0" in screen(child.before)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert out.read_text() == expected + "\n"


def test_piped_turns_answer_on_a_terminal(tiny_pair):
    """`echo ... | dflash2 chat` at a terminal: stdin is a pipe (no terminal to turn echo
    off on), stdout the terminal; the answer shows and the chat ends at the pipe's end."""
    expected = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 6)
    child = spawn_chat("echo 'hello model' | " + chat_line(tiny_pair, "--max-tokens", "6"))
    try:
        child.expect(pexpect.EOF)
        shown = screen(child.before)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus, shown[-600:])
    assert screen(expected) in shown and "Traceback" not in shown


def test_a_killed_chat_gives_the_terminal_its_cursor_back(tiny_pair):
    """SIGTERM (or the terminal closing: SIGHUP) mid-answer ends the chat through its exits:
    the live view's hidden cursor is shown again, the status is 128 + 15."""
    child = spawn_chat("exec " + chat_line(tiny_pair, "--max-tokens", "100000"))
    child.logfile_read = seen = io.StringIO()
    try:
        child.expect_exact(PROMPT)
        child.sendline("hello model")
        child.expect("tok/s")  # the answer streams, the cursor hidden
        child.kill(15)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    out = seen.getvalue()
    assert child.exitstatus == 143, (child.exitstatus, child.signalstatus)
    assert "\x1b[?25l" in out and out.rfind("\x1b[?25h") > out.rfind("\x1b[?25l"), out[-300:]
    last = out[out.rfind("tok/s") :]  # the answer's last status says it was stopped
    assert "stopped" in last and "length" not in last, last[-300:]


def test_keys_typed_during_a_one_shot_answer_are_not_echoed_into_it(tiny_pair):
    """--prompt at a terminal: what is typed meanwhile, and Ctrl-C's ^C, stay out of the
    answer (as in the session); Ctrl-C ends it with status 130."""
    begins = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 4).strip()
    line = chat_line(tiny_pair, "--max-tokens", "100000", "-p", "hello model")
    child = spawn_chat("exec " + line)
    child.logfile_read = seen = io.StringIO()
    try:
        child.expect_exact(begins)  # the answer has begun
        child.send("typed")
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130, (child.exitstatus, child.signalstatus)
    assert "typed" not in seen.getvalue() and "^C" not in seen.getvalue()


def test_a_dumb_terminal_gets_the_answer_as_it_streams(tiny_pair):
    """TERM=dumb (Emacs' shell, some IDE consoles) cannot redraw: the answer is written as
    it comes, before it ends (the live view showed nothing until a line was complete),
    then its status line; no escape codes."""
    line = chat_line(tiny_pair, "--max-tokens", "100000")
    env = dict(os.environ, TERM="dumb", COLUMNS="", LINES="")
    child = pexpect.spawn(
        "bash", ["-c", "exec " + line], env=env, encoding="utf-8", dimensions=(40, 160), timeout=90
    )
    child.logfile_read = seen = io.StringIO()
    begins = answer(*tiny_pair, [{"role": "user", "content": "hello model"}], 4).strip()
    try:
        child.expect_exact(PROMPT)
        child.sendline("hello model")
        child.expect_exact(begins)  # while it still runs (100,000 tokens)
        child.sendintr()
        child.expect_exact(PROMPT)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert "tok/s" in seen.getvalue() and "\x1b" not in seen.getvalue()
