"""What the chat shows: the status line, the acceptance sparkline, /stats, /help, and the
streaming answer view (finished lines are printed for good; the current line and the status
line live at the bottom and are redrawn in place)."""

from __future__ import annotations

from .terminal import text_row

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
/temp [X]        sampling temperature (0 = greedy); no value: show it, as below
/top_p [X]       nucleus mass in [0, 1]
/top_k [N]       keep the N most likely tokens (0 = off)
/min_p [X]       min-p filter in [0, 1]
/seed [N|off]    sampling seed
/max [N]         most tokens per answer
/block [N|auto]  tokens verified per round (1 .. the drafter's trained block size)
/spec on|off     speculative decoding, or plain decoding with the same sampler
/thinking on|off thinking in Qwen-style templates
/stats           session statistics and settings
/exit            quit (or Ctrl-D); Ctrl-C stops an answer and keeps the session
//TEXT           send a message that starts with '/' ("/TEXT")"""


def sparkline(histogram, block: int) -> str:
    """One character per committed-per-round count 1..block: '·' none, ▁..█ relative share.
    The last one counts `block` or more: a context-lookup round can commit up to 16 tokens
    whatever the block, and the status bar keeps one width (block characters)."""
    counts = [histogram.get(k, 0) for k in range(1, block)]
    counts.append(sum(n for k, n in histogram.items() if k >= block))
    top = max(counts, default=0)
    return "".join("·" if n == 0 else BARS[max(0, -(-n * len(BARS) // top) - 1)] for n in counts)


# Each status field has a widest form and shorter ones ("" drops it). When the line is too wide
# for the terminal, these steps (field, form) are taken in order until it fits: draft/verify
# cost and prompt reuse give way first, then τ's last round, lookup, datastore, block, tokens
# and the sparkline; tokens/s stays.
NARROWING = (
    ("cost", 1),
    ("prompt", 1),
    ("cost", 2),
    ("prompt", 2),
    ("tau", 1),
    ("spec", 1),
    ("tps", 1),
    ("lookup", 1),
    ("datastore", 1),
    ("block", 1),
    ("tokens", 1),
    ("spark", 1),
    ("spec", 2),
    ("finish", 1),
    ("tau", 2),
)
SEP = " │ "


class StatusLine:
    """The status line, rendered at the widest form that fits the console on one line (never
    wrapped); not on a terminal, the widest form. `fit(width)` gives that form as Text."""

    def __init__(self, fields: list[tuple[str, tuple[str, ...], str]]):
        self.fields = fields  # (name, forms widest first, style)

    def fit(self, width: int | None = None) -> Text:
        level = dict.fromkeys((name for name, _, _ in self.fields), 0)
        text = self._render(level)
        for name, form in NARROWING:
            if width is None or text.cell_len <= width:
                break
            if name in level:
                level[name] = form
                text = self._render(level)
        if width is not None and text.cell_len > width:
            text.truncate(width, overflow="ellipsis")
        return text

    def _render(self, level: dict[str, int]) -> Text:
        t = Text(style="dim")
        for name, forms, style in self.fields:
            shown = forms[min(level[name], len(forms) - 1)]
            if shown:
                if t:
                    t.append(SEP)
                t.append(shown, style=style)
        return t

    @property
    def plain(self) -> str:
        return self.fit().plain

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fit(options.max_width if console.is_terminal else None)


def status_text(stats, *, block: int, spec: bool, finish: str | None = None) -> StatusLine:
    """tok/s · τ mean (last) · sparkline · block · lookup and datastore shares · draft vs
    verify ms per round · tokens · prompt reuse · finish, each with its shorter forms (see
    NARROWING)."""
    tps = stats.decode_tps
    fields = [
        (
            "tps",
            (f"{tps:7.1f} tok/s", f"{tps:.1f} tok/s") if tps else ("    — tok/s", "— tok/s"),
            "bold cyan",
        )
    ]
    if spec:
        share = 100 * stats.lookup_rounds / max(stats.rounds, 1)
        stored = 100 * stats.datastore_rounds / max(stats.rounds, 1)
        fields += [
            (
                "tau",
                (f"τ {stats.tau:4.2f} (last {stats.last_round})", f"τ {stats.tau:4.2f}", ""),
                "bold green",
            ),
            ("spark", (sparkline(stats.histogram, block), ""), "green"),
            ("block", (f"block {block}", ""), ""),
            ("lookup", (f"lookup {share:.0f}%" if stats.lookup_rounds else "", ""), ""),
            ("datastore", (f"store {stored:.0f}%" if stats.datastore_rounds else "", ""), ""),
        ]
    else:
        fields.append(("spec", ("spec off (plain decoding)", "spec off", ""), "yellow"))
    rounds = max(stats.rounds, 1)
    draft, verify = stats.draft_ms / rounds, stats.verify_ms / rounds
    cost = (  # plain decoding drafts nothing: a round is one token's forward
        (
            f"draft {draft:.1f} · verify {verify:.1f} ms/round",
            f"draft {draft:.1f} · verify {verify:.1f} ms",
        )
        if spec
        else (f"{verify:.1f} ms/token", f"{verify:.0f} ms")
    )
    fields += [
        ("cost", (*cost, ""), ""),
        ("tokens", (f"{stats.committed} tok", ""), ""),
        (
            "prompt",
            (
                f"prompt {stats.prompt_tokens} new + {stats.reused_tokens} reused",
                f"prompt {stats.prompt_tokens}+{stats.reused_tokens}",
                "",
            ),
            "",
        ),
    ]
    if finish:
        fields.append(("finish", (finish, ""), "yellow" if finish == "stopped" else "dim"))
    return StatusLine(fields)


def stats_table(total, turns: int, context: tuple[int, int], settings: dict, block: int) -> Group:
    """`context`: (tokens in the conversation, the model's context length)."""
    table = Table(title="session", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("turns", turns),
        ("answer tokens", total.committed),
        ("rounds", total.rounds),
        ("τ (tokens / round)", f"{total.tau:.3f}"),
        ("draft acceptance", f"{100 * total.acceptance_rate:.1f}% of {total.drafted} drafted"),
        (
            "context lookup",
            f"{total.lookup_rounds} of {total.rounds} rounds"
            + (f", τ {total.lookup_tau:.2f}" if total.lookup_rounds else ""),
        ),
        (
            "response datastore",
            f"{total.datastore_rounds} of {total.rounds} rounds"
            + (f", τ {total.datastore_tau:.2f}" if total.datastore_rounds else ""),
        ),
        ("decode speed", f"{total.decode_tps:.1f} tok/s"),
        ("draft / verify", f"{total.draft_ms:.0f} ms / {total.verify_ms:.0f} ms"),
        ("prefill", f"{total.prompt_tokens} tokens in {total.prefill_ms:.0f} ms"),
        ("reused from cache", f"{total.reused_tokens} prompt tokens"),
        ("context", f"{context[0]:,} of {context[1]:,} tokens (then the oldest turns are dropped)"),
    ]
    for k, v in rows:
        text_row(table, k, str(v))
    hist = Table(title="tokens committed per round", show_header=True, box=None, pad_edge=False)
    hist.add_column("n", justify="right")
    hist.add_column("rounds", justify="right")
    hist.add_column("")
    top = max(total.histogram.values(), default=0)
    # 1..block, then the counts above it that occurred (context-lookup rounds, up to 16)
    for k in sorted({*range(1, block + 1), *total.histogram}):
        n = total.histogram.get(k, 0)
        text_row(hist, str(k), str(n), "█" * (max(1, round(30 * n / top)) if n else 0))
    conf = Table(title="settings", show_header=False, box=None, pad_edge=False)
    conf.add_column(style="bold")
    conf.add_column()
    for k, v in settings.items():
        text_row(conf, k, str(v))
    return Group(table, Text(""), hist, Text(""), conf)


class _Tail:
    """The last `rows` screen lines of a text (an over-long paragraph scrolls in place)."""

    def __init__(self, text: Text, rows: int):
        self.text, self.rows = text, rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.text, options, pad=False)
        for line in lines[-self.rows :]:
            yield from line
            yield Segment.line()


class AnswerView:
    """Streams one answer: complete lines are printed above, the rest and the status below."""

    def __init__(self, console: Console, refresh_s: float = 0.05):
        self.console = console
        self.partial = Text()
        self.status: StatusLine | Text = Text("")
        self.refresh_s = refresh_s
        self.shown = 0.0
        self.live = Live(
            console=console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def __enter__(self):
        self.live.start()
        return self

    def __exit__(self, *exc):
        self.live.stop()
        if self.partial:
            self.console.print(self.partial)
            self.partial = Text()
        self.console.print(self.status)

    def _render(self):
        rows = max(self.console.size.height - 4, 1)
        parts = [_Tail(self.partial, rows)] if self.partial else []
        return Group(*parts, self.status)

    def update(self, text: str, status: StatusLine, force: bool = False, style: str = "") -> None:
        self.partial.append(text, style=style or None)
        self.status = status
        if "\n" in text:
            *done, self.partial = self.partial.split("\n", allow_blank=True)
            self.live.console.print(Text("\n").join(done))
            force = True
        now = time.monotonic()
        if force or now - self.shown >= self.refresh_s:
            self.live.update(self._render(), refresh=True)
            self.shown = now
