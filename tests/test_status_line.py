"""The chat status line: the widest form that fits the terminal, on one line, never wrapped;
fields give way in the documented order (chat_view.NARROWING)."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from rich.console import Console

from dflash2_cli.chat_view import status_text
from dflash2_mlx import GenerationStats

FULL = (
    "  550.0 tok/s │ τ 4.40 (last 8) │ ▇▃▄▂▂▂▂█ │ block 8 │ lookup 20% │ draft 2.0 · "
    "verify 6.0 ms/round │ 177 tok │ prompt 1234 new + 5678 reused │ length"
)


def stats() -> GenerationStats:
    """40 rounds of a block-8 answer, 8 of them from context lookup, after a cached prompt."""
    return GenerationStats(
        rounds=40,
        drafted=280,
        accepted=136,
        committed=177,
        draft_ms=80.0,
        verify_ms=240.0,
        prefill_ms=9.0,
        prompt_tokens=1234,
        reused_tokens=5678,
        histogram=Counter({1: 10, 2: 4, 3: 6, 4: 2, 5: 2, 6: 2, 7: 2, 8: 12}),
        last_round=8,
        lookup_rounds=8,
    )


def printed(line, width: int, terminal: bool = True, **kw) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=terminal, color_system=None).print(line, **kw)
    return out.getvalue()


@pytest.mark.parametrize(
    "width, expected",
    [
        (200, FULL),
        (
            120,
            "  550.0 tok/s │ τ 4.40 (last 8) │ ▇▃▄▂▂▂▂█ │ block 8 │ lookup 20% │ 177 tok │ "
            "prompt 1234+5678 │ length",
        ),
        (80, "  550.0 tok/s │ τ 4.40 │ ▇▃▄▂▂▂▂█ │ block 8 │ lookup 20% │ 177 tok │ length"),
        (40, "550.0 tok/s │ τ 4.40 │ ▇▃▄▂▂▂▂█ │ length"),
    ],
)
def test_widest_form_that_fits(width, expected):
    line = status_text(stats(), block=8, spec=True, finish="length")
    assert line.fit(width).plain == expected
    assert line.fit(width).cell_len <= width
    assert printed(line, width) == expected + "\n"  # one line on a terminal that wide


def test_narrowing_keeps_the_most_useful_fields():
    line = status_text(stats(), block=8, spec=True, finish="stopped")
    assert line.plain == FULL.replace("length", "stopped")  # the widest form
    shown = [line.fit(w).plain for w in range(len(line.plain), 4, -1)]
    for wider, narrower in zip(shown, shown[1:]):
        assert len(narrower) <= len(wider)
    assert all(s.lstrip().startswith("550.0 tok/s") for s in shown if len(s) >= 11)
    assert line.fit(20).plain == "550.0 tok/s │ τ 4.40"  # tokens/s and τ stay longest
    assert line.fit(8).plain == "550.0 t…"  # narrower than any form: cut, still one line


def test_plain_decoding_and_no_speed_yet():
    line = status_text(stats(), block=1, spec=False, finish="length")
    assert "spec off (plain decoding)" in line.plain and "τ" not in line.plain
    assert "ms/token" in line.plain and "draft" not in line.plain  # no draft to time
    assert line.fit(60).plain == "  550.0 tok/s │ spec off (plain decoding) │ 177 tok │ length"
    assert line.fit(40).plain == "550.0 tok/s │ spec off │ length"
    first = status_text(GenerationStats(), block=8, spec=True)
    assert first.fit(80).plain.startswith("    — tok/s │ τ 0.00 (last 0) │ ········")


def test_not_a_terminal_gets_the_widest_form_on_one_line():
    line = status_text(stats(), block=8, spec=True, finish="length")
    assert printed(line, 40, terminal=False, soft_wrap=True) == FULL + "\n"
