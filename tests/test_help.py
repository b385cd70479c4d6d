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


def broken_lines(rows: list[str]) -> list[tuple[str, str]]:
    """Pairs of consecutive rows of one text block where the next row's first word would have
    fitted on the row before (the block's widest row is a lower bound of its wrap width): a
    line break that word wrapping did not make."""
    width = max(map(len, rows), default=0)
    return [
        (a, b)
        for a, b in zip(rows, rows[1:])
        if a and b and not b.startswith("Example:") and len(a) + 1 + len(b.split()[0]) <= width
    ]


def section(lines: list[str], start: str, ends: tuple[str, ...]) -> list[str]:
    """The rows after the line starting with `start`, up to the first starting with one of
    `ends` (or the end), right-stripped."""
    first = next(i for i, line in enumerate(lines) if line.strip().startswith(start))
    rows = []
    for line in lines[first + 1 :]:
        if line.strip().startswith(ends):
            break
        rows.append(line.rstrip())
    return rows


def cells(rows: list[str]) -> list[list[str]]:
    """A two-column list (name, text) as the text column's rows, cell by cell."""
    rows = [r for r in rows if r.strip()]
    name_end = len(rows[0]) - len(rows[0].lstrip()) + len(rows[0].split()[0])
    col = name_end + len(rows[0][name_end:]) - len(rows[0][name_end:].lstrip())
    out: list[list[str]] = []
    for row in rows:
        if row[:col].strip():  # a name: a new cell
            out.append([])
        out[-1].append(row[col:].strip())
    return out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    "argv", [[]] + [[c] for c in COMMANDS], ids=lambda a: "-".join(a) or "dflash2"
)
def test_help_flows_at_any_width(argv, width, capsys, monkeypatch):
    lines = render(argv, width, capsys, monkeypatch)
    text = "\n".join(lines)
    assert "<bool>" not in text and " range>" not in text and "…" not in text
    assert all(len(line) <= width for line in lines)
    about = [r.strip() for r in section(lines, "Usage:", ("Arguments:", "Options:"))]
    assert not broken_lines(about)
    examples = [i for i, row in enumerate(about) if row.startswith("Example:")]
    assert examples and all(
        about[i + 1] == "" or about[i + 1].startswith("Example:")
        for i in examples
        if i + 1 < len(about)
    )  # each on one line
    assert not [line for line in lines if re.search(r"(^|\s)--[\w-]*-$", line)]  # --no-\nx
    if not argv:
        listed = cells(section(lines, "Commands:", ()))
        assert len(listed) == len(COMMANDS)
        assert any(len(cell) > 1 for cell in listed)  # some wrap at these widths: a real check
        for cell in listed:
            assert not broken_lines(cell), cell
            assert not cell[-1].endswith("..."), cell  # the whole first paragraph, not cut


def squashed(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


def test_known_sentences_are_whole(capsys, monkeypatch):
    serve = render(["serve"], 80, capsys, monkeypatch)
    assert "Usage in every response carries acceptance stats" in squashed(serve)
    assert re.search(
        r"^  --port <int> +Port to listen on\. +\[default: 8000; 1<=x<=65535\]$",
        "\n".join(serve),
        re.M,
    )  # a range is still shown, after a plain <int>
    bench = squashed(render(["bench"], 80, capsys, monkeypatch))
    assert "(greedy, same prompt ids, outputs checked token for token)" in bench
    listed = squashed(render([], 80, capsys, monkeypatch))
    assert "same prompt ids, outputs checked token for token), or autotune" in listed


def test_flags_show_no_metavar_and_defaults_in_help_text_show(capsys, monkeypatch):
    chat = render(["chat"], 120, capsys, monkeypatch)
    for flag in ("--no-spec", "--offline", "--full-vocab", "--help"):
        assert [line for line in chat if re.match(rf"  {flag} +[A-Z][a-z]", line)], flag
    assert [line for line in chat if re.match(r"  --thinking / --no-thinking +Turn", line)]
    text = squashed(chat)
    assert "[default: none: each generation draws its own]" in text  # rich would eat it
    assert "[default: 3]" in text and "else greedy]" in text


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
    assert flow(source) == (
        "First line goes on here.\n\nA second paragraph, wrapped.\n"
        "Example: dflash2 chat\nExample: dflash2 serve\n\n\b\nkept\nas is"
    )
    assert flow("- one\n- two\n  continued") == "- one\n- two continued"
    assert flow(None) is None and flow("") == ""


def test_tidy_group_in_rich_mode(capsys, monkeypatch):
    """Switched to rich's layout, the same group keeps help literal and flowing, flags bare."""
    from dflash2_cli.helptext import TidyGroup

    demo = typer.Typer(cls=TidyGroup, rich_markup_mode="rich", add_completion=False)

    @demo.command()
    def go(
        fast: bool = typer.Option(False, "--fast", help="Go fast [default: slow]."),
        n: int = typer.Option(1, "--n", min=1, help="How many."),
    ):
        """Go somewhere, a sentence wrapped
        in the source.

        Example: demo go --fast
        """

    @demo.command()
    def stay():
        """Stay."""

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        demo(["go", "--help"], prog_name="demo")
    out = capsys.readouterr().out
    assert "Go somewhere, a sentence wrapped in the source." in out
    assert "[default: slow]" in out and "<bool>" not in out and "<int> [x>=1]" in out
