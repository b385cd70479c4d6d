"""The chat's slash commands (/temp, /block, /stats, ...): a mixin of `Chat` (chat_repl.py),
which holds the state they read and change."""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text

from dflash2_mlx.chat_template import TemplateInfo, default_thinking
from dflash2_mlx.sampling import field_problem
from dflash2_mlx.errors import DFlash2Error, ParameterError
from dflash2_mlx.settings import BlockChoice, check_block
from dflash2_mlx.target.context import default_context_length

from .chat_view import HELP, stats_table
from .terminal import interactive


def _template_has_thinking(tokenizer) -> bool:
    return TemplateInfo.of(tokenizer).thinking_switch  # as `serve` decides it


def thinking_shown(tokenizer, thinking: bool | None) -> str:
    """The thinking setting in words: on, off, or the template's default and what it is
    (read off the template: its prompt with the switch left out is its prompt with it on or
    off), or that the template has no switch."""
    if not _template_has_thinking(tokenizer):
        return "the chat template has no thinking switch"
    if thinking is not None:
        return "on" if thinking else "off"
    default = default_thinking(tokenizer)
    words = {True: " (on)", False: " (off)", None: ""}[default]
    return "the chat template's default" + words


class SlashCommands:
    """`command(line)` runs one; each handler takes (name, arg)."""

    def command(self, line: str) -> bool:
        """Run a slash command; False means exit."""
        name, _, arg = line.strip().partition(" ")
        name, arg = name.lower(), arg.strip()
        try:
            return self._command(name, arg)
        except DFlash2Error as exc:
            return self._bad(str(exc))

    def _bad(self, text: str) -> bool:
        self.failures += 1
        self.err.print(Text(f"error: {text}", style="red"))
        return True

    def _number(self, name: str, arg: str, kind):
        try:
            return kind(arg)
        except ValueError:
            raise _Bad(
                f"{name} needs {'an integer' if kind is int else 'a number'}, {_got(arg)}"
            ) from None

    def _command(self, name: str, arg: str) -> bool:
        """Runs a slash command; False ends the chat (/exit, /quit)."""
        if name in _NO_ARGUMENT and arg:
            return self._bad(f"{name} takes no argument, got {arg!r}")
        if name in ("/exit", "/quit"):
            return False
        run = _COMMANDS.get(name)
        if run is None:
            return self._bad(f"unknown command {name} (type /help)")
        try:
            getattr(self, run)(name, arg)
        except _Bad as exc:
            return self._bad(str(exc))
        return True

    def _say(self, text, style: str = "") -> None:
        """A command's output: stdout at a terminal, stderr when either end is not one (stdout
        then holds the answers alone)."""
        out = self.console if interactive() else self.err
        out.print(Text(text, style=style) if isinstance(text, str) else text)

    def _help(self, name: str, arg: str) -> None:
        self._say(HELP)

    def _clear(self, name: str, arg: str) -> None:
        self.history = []
        self._say("conversation cleared", "dim")

    def _set_system(self, name: str, arg: str) -> None:
        if not arg:
            self._say(f"system: {self.system!r}" if self.system else "no system prompt")
            return
        self.system = None if arg == "-" else arg
        self._say("system prompt removed" if arg == "-" else "system prompt set", "dim")

    def _set_sampling(self, name: str, arg: str) -> None:
        field = {"/temp": "temperature"}.get(name, name[1:])
        if not arg:  # as /system and /block: the current value
            return self._say(f"{field} = {getattr(self.sampling, field)}")
        if name == "/seed" and arg.lower() == "off":
            value = None
        else:
            value = self._number(name, arg, int if name in ("/top_k", "/seed") else float)
        problem = field_problem(field, value)
        if problem:  # this field's rule alone, not every field of the sampler
            raise ParameterError(f"{name}: {problem}, got {value}")
        before, self.sampling = self.block_now(), replace(self.sampling, **{field: value})
        now = self.block_now()  # the profile's block_by_temperature may change it
        self._say(f"{field} = {value}" + (f" (block {now})" if now != before else ""), "dim")
        self.warn_greedy_filters()

    def _set_max(self, name: str, arg: str) -> None:
        if not arg:
            return self._say(f"max tokens = {self.max_tokens}")
        value = self._number(name, arg, int)
        if value < 1:
            raise _Bad(f"/max must be a number of tokens >= 1, got {value}")
        self.max_tokens = value
        self._say(f"max tokens = {value}", "dim")

    def _set_block(self, name: str, arg: str) -> None:
        if not arg:
            auto = self.engine.auto_block.describe()
            self._say(f"block {self.block_now()} (trained {self.trained}); /block auto: {auto}")
            return
        if arg == "auto":
            self.block = self.engine.auto_block
        else:
            size = check_block(self._number(name, arg, int), self.trained, "/block")
            self.block = BlockChoice(size, self.trained, "/block")
        now, note = self.block_now(), ""
        if not self.spec:
            note = " (used when /spec on)"
        elif now != self.block.size:  # the profile's block by temperature or context
            note = f" (block {now} at this temperature and context)"
        self._say(f"block = {self.block.size}{note}", "dim")

    def _set_spec(self, name: str, arg: str) -> None:
        self.spec = _on_off(name, arg)
        self._say(f"speculative decoding {'on' if self.spec else 'off'}", "dim")

    def _set_thinking(self, name: str, arg: str) -> None:
        if not arg:  # showing it is no error, with a switch or without
            return self._say(f"thinking: {thinking_shown(self.pair.tokenizer, self.thinking)}")
        on = _on_off(name, arg)
        info = TemplateInfo.of(self.pair.tokenizer)
        if not info.honours_thinking(on):  # what it does anyway is taken, as --thinking
            raise _Bad(
                "this model's chat template has no thinking switch and it "
                f"{'never' if on else 'always'} thinks"
            )
        self.thinking = on if info.thinking_switch else None  # nothing to switch without one
        self._say(f"thinking {'on' if on else 'off'}", "dim")

    def _show_stats(self, name: str, arg: str) -> None:
        self._say(
            stats_table(
                self.total,
                self.turns,
                # the conversation's tokens (the cache keeps a cleared one for reuse)
                (
                    len(self.session.tokens) if self.history else 0,
                    default_context_length(self.pair.model),
                ),
                self.settings(),
                self.block_now(),
            )
        )


def pasted_block(line: str) -> bool:
    """Several lines at once (a bracketed paste): the user's text as it is."""
    return "\n" in line.strip("\n")


def sent_text(line: str) -> str:
    """What a typed line sends: "//x" sends "/x"; a pasted block goes as it is."""
    return line[1:] if line.startswith("//") and not pasted_block(line) else line


def is_command(line: str) -> bool:
    """A slash command: "/name ..." (not "//", which sends "/..."), or a known command's name
    after spaces (a paste's "  /usr/bin ..." stays text); never a pasted block of lines
    (code opening with a "//" comment, a path and a question about it)."""
    if pasted_block(line):
        return False
    if line.startswith("/"):
        return not line.startswith("//")
    name = line.lstrip().partition(" ")[0].lower()
    return name in _COMMANDS or name in ("/exit", "/quit")


# Slash command -> the Chat method that runs it (name, arg); /exit and /quit end the chat.
_COMMANDS = {
    "/help": "_help",
    "/clear": "_clear",
    "/system": "_set_system",
    **dict.fromkeys(("/temp", "/top_p", "/top_k", "/min_p", "/seed"), "_set_sampling"),
    "/max": "_set_max",
    "/block": "_set_block",
    "/spec": "_set_spec",
    "/thinking": "_set_thinking",
    "/stats": "_show_stats",
}
_NO_ARGUMENT = ("/help", "/clear", "/stats", "/exit", "/quit")


def _on_off(name: str, arg: str) -> bool:
    arg = arg.lower()
    if arg not in ("on", "off"):
        raise _Bad(f"{name} needs on or off, {_got(arg)}")
    return arg == "on"


def _got(arg: str) -> str:
    return f"got {arg!r}" if arg else "got nothing"


class _Bad(Exception):
    pass
