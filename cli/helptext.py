"""`--help` that reads as flowing text: the app's command group tidies every command's help once.

`dflash2` uses click's help layout (rich_markup_mode=None in app.py): at 80 columns typer's rich
panels give option help a 17-30 character column and cut long words with "…". `TidyGroup` works
under either layout, for every command present or future: docstring paragraphs become one
logical line each (rich keeps the source's line breaks; blank lines and "Example:" lines stay),
the commands list shows each command's whole first paragraph (click would cut it at "..."),
`[...]` in help is escaped where rich would parse it as markup (so "[default: 3]" shows), flags
show no metavar (no `<bool>`) and ranged numbers read `<int>`, not `<int range>` (the range is
printed beside it).
"""

from __future__ import annotations

import inspect
import re

from typer.core import TyperGroup

# A line that starts a new line even inside a paragraph: an example, a list item.
_OWN_LINE = re.compile(r"(Example:|[-*•] |\d+[.)] )")


def flow(text: str | None) -> str | None:
    """Join the source's line wraps inside each paragraph; keep paragraphs, "Example:" and list
    lines, and click's `\\b` (no rewrap) paragraphs as they are."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else _join_lines(p) for p in paragraphs)


def _join_lines(paragraph: str) -> str:
    lines: list[str] = []
    for line in paragraph.splitlines():
        line = line.strip()
        if lines and line and not _OWN_LINE.match(line):
            lines[-1] += " " + line
        elif line:
            lines.append(line)
    return "\n".join(lines)


def tidy_command(command) -> None:
    """Flowing help for `command`, markup escaped where rich renders it; no flag metavars."""
    literal = _literal if getattr(command, "rich_markup_mode", None) == "rich" else _as_is
    command.help = literal(flow(command.help))
    # the commands list shows the whole first paragraph (click would cut it at "...")
    command.short_help = literal(flow(command.short_help)) or (command.help or "").split("\n\n")[0]
    for param in command.params:
        param.help = literal(getattr(param, "help", None))
        _tidy_metavar(param)


def _literal(text: str | None) -> str | None:
    from rich.markup import escape  # only where rich renders the help

    return escape(text) if text else text


def _as_is(text: str | None) -> str | None:
    return text


def _tidy_metavar(param) -> None:
    if param.metavar is not None or param.param_type_name != "option":
        return  # set by hand; an argument's metavar is its name
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""  # a flag takes no value: no `<bool>`
        return
    descriptor = getattr(param, "type_descriptor", None)  # recent typers (0.12: INTEGER RANGE)
    if descriptor is not None and getattr(descriptor, "is_ranged", False):
        param.metavar = f"<{descriptor.ranged_type_name}>"  # not `<int range>`


class TidyGroup(TyperGroup):
    """The `dflash2` group: its own help and every subcommand's, tidied when it is built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for command in (self, *self.commands.values()):
            tidy_command(command)

    def get_help_option(self, ctx):
        return _no_metavar(super().get_help_option(ctx))

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:  # click makes each --help option lazily, from the context
            _no_metavar(command.get_help_option(ctx))
        return command


def _no_metavar(option):
    if option is not None and option.metavar is None:
        option.metavar = ""
    return option
