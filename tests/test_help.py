"""`--help` reads as flowing text at 80 and 120 columns: no line broken where the source was
wrapped, no `<bool>` / `<int range>` metavars, `[default: ...]` in help text shown."""

from __future__ import annotations

import re

import pytest
import typer

from dflash2_cli.app import app, run
from dflash2_cli.helptext import flow

COMMANDS = sorted(typer.main.get_command(app).commands)
WIDTHS = (80, 120)


def render(argv: list[str], width: int, capsys, monkeypatch) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(width))
    assert run([*argv, "--help"]) == 0
    return capsys.readouterr().out.splitlines()


def broken_lines(rows: list[str], width: int) -> list[tuple[str, str]]:
    """Pairs of consecutive rows of one text block where the next row's first word would have
    fitted on the row before: a line break that word wrapping did not make."""
    return [(a, b) for a, b in zip(rows, rows[1:])
            if a and b and not b.startswith("Example:") and len(a) + 1 + len(b.split()[0]) <= width]


def description(lines: list[str]) -> list[str]:
    """The command's help text: the rows between the Usage line and the first panel."""
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:"))
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    return [line.strip() for line in lines[start + 1:end]]


def panel_cells(lines: list[str], title: str) -> tuple[list[list[str]], int]:
    """The second column of a two-column panel (the commands list), cell by cell (a cell's
    rows), and that column's width."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"╭─ {title}"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("╰"))
    rows = [line[1:-1] for line in lines[start + 1:end]]
    first = rows[0]
    col = len(first) - len(first.lstrip()) + len(first.split()[0])
    col += len(first[col:]) - len(first[col:].lstrip())
    cells: list[list[str]] = []
    for row in rows:
        if row[:col].strip():  # a command's name: a new cell
            cells.append([])
        cells[-1].append(row[col:].strip())
    return cells, len(first) - col - 1


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("argv", [[]] + [[c] for c in COMMANDS],
                         ids=lambda a: "-".join(a) or "dflash2")
def test_help_flows_at_any_width(argv, width, capsys, monkeypatch):
    lines = render(argv, width, capsys, monkeypatch)
    text = "\n".join(lines)
    assert "<bool>" not in text and " range>" not in text
    assert all(len(line) <= width for line in lines)
    assert not broken_lines(description(lines), width - 2)  # one column of padding each side
    if not argv:
        cells, cell_width = panel_cells(lines, "Commands")
        assert len(cells) == len(COMMANDS)
        assert any(len(cell) > 1 for cell in cells)  # some wrap at these widths: a real check
        for cell in cells:
            assert not broken_lines(cell, cell_width), cell


def test_known_sentences_are_whole(capsys, monkeypatch):
    serve = "\n".join(render(["serve"], 120, capsys, monkeypatch))
    assert "Usage in every response carries acceptance stats" in serve
    assert "<int> [1<=x<=65535]" in serve  # a range is still shown, beside a plain <int>
    bench = "\n".join(render(["bench"], 120, capsys, monkeypatch))
    assert "(greedy, same prompt ids, outputs checked token for token)" in bench
    assert "same prompt ids, outputs checked" in "\n".join(render([], 120, capsys, monkeypatch))


def test_flags_show_no_metavar_and_defaults_in_help_text_show(capsys, monkeypatch):
    chat = render(["chat"], 120, capsys, monkeypatch)
    for flag in ("--no-spec", "--offline", "--full-vocab", "--help"):
        row = next(line for line in chat if f"│ {flag} " in line)
        assert re.match(rf"│ {flag} +[A-Z][a-z]", row), row  # the flag, then its help
    squashed = " ".join(" ".join(line.strip("│ ") for line in chat).split())
    assert "[default: a random one]" in squashed  # rich markup would have eaten it
    assert "[default: 3]" in squashed and "else greedy]" in squashed


def test_flow_joins_wrapped_lines_and_keeps_the_rest():
    source = """First line
        goes on here.

        A second paragraph,
        wrapped.
        Example: dflash2 chat
        Example: dflash2 serve

        \b
        kept
        as is
    """
    assert flow(source) == ("First line goes on here.\n\nA second paragraph, wrapped.\n"
                            "Example: dflash2 chat\nExample: dflash2 serve\n\n\b\nkept\nas is")
    assert flow("- one\n- two\n  continued") == "- one\n- two continued"
    assert flow(None) is None and flow("") == ""
