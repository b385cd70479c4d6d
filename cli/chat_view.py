"""What the chat shows: the status line, the acceptance sparkline, /stats, /help, and the
streaming answer view (finished lines are printed for good; the current line and the status
line live at the bottom and are redrawn in place)."""

from __future__ import annotations

import time

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

BARS = "▁▂▃▄▅▆▇█"

HELP = """\
/help            this list
/clear           forget the conversation (keeps the system prompt and the settings)
/system [TEXT]   show, or set, the system prompt ('/system -' removes it)
/temp X          sampling temperature (0 = greedy)
/top_p X         nucleus mass in (0, 1]
/top_k N         keep the N most likely tokens (0 = off)
/min_p X         min-p filter in [0, 1)
/seed N|off      sampling seed
/max N           most tokens per answer
/block N|auto    tokens verified per round (1 .. the drafter's trained block size)
/spec on|off     speculative decoding, or plain decoding with the same sampler
/thinking on|off thinking in Qwen-style templates
/stats           session statistics and settings
/exit            quit (or Ctrl-D); Ctrl-C stops an answer and keeps the session"""


def sparkline(histogram, block: int) -> str:
    """One character per committed-per-round count 1..block: '·' none, ▁..█ relative share."""
    top = max((histogram.get(k, 0) for k in range(1, block + 1)), default=0)
    out = []
    for k in range(1, block + 1):
        n = histogram.get(k, 0)
        out.append("·" if n == 0 else BARS[max(0, -(-n * len(BARS) // top) - 1)])
    return "".join(out)


def status_text(stats, *, block: int, spec: bool, finish: str | None = None) -> Text:
    """tok/s · τ mean (last) · sparkline · block · lookup share · draft vs verify ms per round ·
    prompt reuse."""
    t = Text(style="dim")
    tps = stats.decode_tps
    t.append(f"{tps:7.1f} tok/s" if tps else "    — tok/s", style="bold cyan")
    if spec:
        t.append(f" │ τ {stats.tau:4.2f} (last {stats.last_round})", style="bold green")
        t.append(" │ ")
        t.append(sparkline(stats.histogram, block), style="green")
        t.append(f" │ block {block}")
        if stats.lookup_rounds:
            t.append(f" │ lookup {100 * stats.lookup_rounds / max(stats.rounds, 1):.0f}%")
    else:
        t.append(" │ spec off (plain decoding)", style="yellow")
    rounds = max(stats.rounds, 1)
    t.append(f" │ draft {stats.draft_ms / rounds:.1f} · verify {stats.verify_ms / rounds:.1f}"
             " ms/round")
    t.append(f" │ {stats.committed} tok │ prompt {stats.prompt_tokens} new + "
             f"{stats.reused_tokens} reused")
    if finish:
        t.append(f" │ {finish}", style="yellow" if finish == "stopped" else "dim")
    return t


def stats_table(total, turns: int, context_tokens: int, settings: dict, block: int) -> Group:
    table = Table(title="session", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("turns", turns), ("answer tokens", total.committed), ("rounds", total.rounds),
        ("τ (tokens / round)", f"{total.tau:.3f}"),
        ("draft acceptance", f"{100 * total.acceptance_rate:.1f}% of {total.drafted} drafted"),
        ("context lookup", f"{total.lookup_rounds} of {total.rounds} rounds"),
        ("decode speed", f"{total.decode_tps:.1f} tok/s"),
        ("draft / verify", f"{total.draft_ms:.0f} ms / {total.verify_ms:.0f} ms"),
        ("prefill", f"{total.prompt_tokens} tokens in {total.prefill_ms:.0f} ms"),
        ("reused from cache", f"{total.reused_tokens} prompt tokens"),
        ("context in cache", f"{context_tokens} tokens"),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    hist = Table(title="tokens committed per round", show_header=True, box=None, pad_edge=False)
    hist.add_column("n", justify="right")
    hist.add_column("rounds", justify="right")
    hist.add_column("")
    top = max(total.histogram.values(), default=0)
    for k in range(1, max([block, *total.histogram]) + 1):
        n = total.histogram.get(k, 0)
        hist.add_row(str(k), str(n), "█" * (max(1, round(30 * n / top)) if n else 0))
    conf = Table(title="settings", show_header=False, box=None, pad_edge=False)
    conf.add_column(style="bold")
    conf.add_column()
    for k, v in settings.items():
        conf.add_row(k, str(v))
    return Group(table, Text(""), hist, Text(""), conf)


class _Tail:
    """The last `rows` screen lines of a text (an over-long paragraph scrolls in place)."""

    def __init__(self, text: Text, rows: int):
        self.text, self.rows = text, rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.text, options, pad=False)
        for line in lines[-self.rows:]:
            yield from line
            yield Segment.line()


class AnswerView:
    """Streams one answer: complete lines are printed above, the rest and the status below."""

    def __init__(self, console: Console, refresh_s: float = 0.05):
        self.console = console
        self.partial = ""
        self.status = Text("")
        self.refresh_s = refresh_s
        self.shown = 0.0
        self.live = Live(console=console, auto_refresh=False, transient=True,
                         redirect_stdout=False, redirect_stderr=False)

    def __enter__(self):
        self.live.start()
        return self

    def __exit__(self, *exc):
        self.live.stop()
        if self.partial:
            self.console.print(Text(self.partial))
            self.partial = ""
        self.console.print(self.status)

    def _render(self):
        rows = max(self.console.size.height - 4, 1)
        parts = [_Tail(Text(self.partial), rows)] if self.partial else []
        return Group(*parts, self.status)

    def update(self, text: str, status: Text, force: bool = False) -> None:
        self.partial += text
        self.status = status
        if "\n" in self.partial:
            done, self.partial = self.partial.rsplit("\n", 1)
            self.live.console.print(Text(done))
            force = True
        now = time.monotonic()
        if force or now - self.shown >= self.refresh_s:
            self.live.update(self._render(), refresh=True)
            self.shown = now
