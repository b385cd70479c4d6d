"""The terminal chat: load a pair, then one turn (--prompt) or a read-eval loop.

One `Session` serves the whole conversation: each turn re-templates the history and the engine
reuses the cached common prefix (shown as "reused" on the status line). Ctrl-C during an answer
sets a flag checked between rounds, so the engine stops at a round boundary with a consistent
cache and the conversation goes on; a second Ctrl-C interrupts at once and resets the cache.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional

from rich.console import Console
from rich.text import Text

from dflash2_mlx import GenerationParams, GenerationStats
from dflash2_mlx.engine.budget import ThinkingBudget, can_budget
from dflash2_mlx.engine.processors import penalties
from dflash2_mlx.errors import DFlash2Error, ParameterError
from dflash2_mlx.settings import Drafting, EngineFlags, EngineSettings
from dflash2_mlx.settings import idle_when_greedy
from dflash2_mlx.target.context import default_context_length
from dflash2_mlx.text import chat_prompt_ids, quiet_length_warning, stream_text

from .chat_commands import SlashCommands, is_command, sent_text, thinking_shown
from .chat_thinking import THINKING, ThinkingSplit
from .chat_view import AnswerView, StatusLine, status_text
from .common import check_thinking_flag, fail
from .stop_flag import StopFlag
from .terminal import interactive, keys_unechoed, line_editing, read_line, utf8_problem


@dataclass
class ChatOptions:
    """`dflash2 chat`'s options as parsed (cli/chat.py)."""

    model: Optional[str]
    target: Optional[str]
    drafter: Optional[str]
    prompt: Optional[str]
    system: Optional[str]
    max_tokens: int
    thinking: Optional[bool]
    offline: bool
    engine_flags: EngineFlags  # block, spec, lookup, draft vocabulary, sampling: as given
    repetition_penalty: Optional[float] = None  # mlx-lm's (engine/processors.py); None: none
    thinking_budget: Optional[int] = None  # most thinking tokens (engine/budget.py); None: any


class Chat(SlashCommands):
    def __init__(
        self, pair, opts: ChatOptions, settings: EngineSettings, console: Console, err: Console
    ):
        self.pair, self.opts, self.console, self.err = pair, opts, console, err
        check_thinking_flag(pair.tokenizer, opts.thinking)
        self.engine = settings
        if settings.auto_block.note:  # a recommendation clamped, or a damaged profile
            self.note(settings.auto_block.note)
        self.trained = settings.block.trained
        self.block = settings.block  # its size, and where the profile lowers it
        self.sampling = settings.sampling.params
        self.max_tokens = opts.max_tokens
        self.spec, self.thinking = settings.speculative, opts.thinking
        vocab = pair.vocab_size
        self.repetition_penalty = opts.repetition_penalty
        self.processors = penalties(vocab, repetition_penalty=opts.repetition_penalty)
        self.thinking_budget = opts.thinking_budget
        if self.thinking_budget is not None and not can_budget(pair.tokenizer):
            fail("--thinking-budget: this model has no thinking section to budget")
        self.params()  # validate now, before the first turn
        self.system = opts.system
        self.history: list[dict] = []
        self.session = pair.new_session()  # one Session for the whole conversation
        self.total = GenerationStats()
        self.thinking_shown = False  # the last piece of a reply shown was its thinking
        self.prefilling = 0  # prompt tokens the current turn prefills
        self.turns = 0
        self.failures = 0  # lines refused or failed (a piped chat exits 2 if any)
        self.warn_greedy_filters(only=settings.sampling.from_flags)

    # ----------------------------------------------------------------- helpers
    def note(self, text: str) -> None:
        self.err.print(Text(f"note: {text}", style="yellow"))

    def room(self, n_prompt: int) -> int:
        """max_tokens, cut (with a note) to what the model's context leaves after the prompt;
        a prompt that fills the context is an error, as the server's 400."""
        context = default_context_length(self.pair.model)
        room = context - n_prompt
        if room < 1:  # alone: fitted_prompt drops the turns before it first
            raise ParameterError(
                f"the prompt is {n_prompt} tokens and the model's context {context}: shorten it"
            )
        if self.max_tokens > room:
            self.note(
                f"this answer is limited to {room} tokens: the prompt takes {n_prompt} of "
                f"the model's {context}"
            )
            return room
        return self.max_tokens

    def params(self, prompt_ids: list[int] = (), max_tokens: int | None = None) -> GenerationParams:
        budget = None
        if self.thinking_budget is not None and prompt_ids:
            vocab = self.pair.vocab_size
            budget = ThinkingBudget.for_prompt(
                self.pair.tokenizer, prompt_ids, self.thinking_budget, vocab
            )
        return GenerationParams(
            max_tokens or self.max_tokens,
            self.sampling,
            **self.drafting().fields(self.sampling.temperature),
            logits_processors=self.processors,
            constraint=budget,
        )

    def drafting(self) -> Drafting:
        """The drafting of the next turn: /spec and /block may have changed it."""
        return Drafting.of(self.spec, self.block, self.engine.lookup_block, self.engine.verify_cost)

    def status(self, stats: GenerationStats, finish: str | None = None) -> StatusLine:
        """The live status: the block is the one at the conversation's length (the profile's
        block_by_context and block_by_temperature may have lowered it). A turn stopped before
        its first token says how much prompt it was prefilling."""
        if finish in ("stopped", "interrupted") and not (stats.prompt_tokens + stats.reused_tokens):
            finish = f"{finish} in the prefill of {self.prefilling:,} prompt tokens"
        return status_text(stats, block=self.block_now(), spec=self.spec, finish=finish)

    def block_now(self) -> int:
        """The block the next round uses: at the chat's temperature and length (1: spec off)."""
        return self.drafting().block_now(
            self.sampling.temperature, len(self.session.tokens), self.block.trained
        )

    def warn_greedy_filters(self, only: tuple[str, ...] | None = None) -> None:
        """Never silently ignored: say which fields greedy decoding does not use (at start,
        only those the user gave, not the model's generation_config.json)."""
        idle = [n for n in idle_when_greedy(self.sampling) if only is None or n in only]
        if idle:
            verb = "has" if len(idle) == 1 else "have"
            self.note(f"{', '.join(idle)} {verb} no effect at temperature 0 (greedy decoding)")

    def messages(self, user: str, history: list[dict] | None = None) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        past = self.history if history is None else history
        return head + past + [{"role": "user", "content": user}]

    def prompt_ids(self, user: str, history: list[dict] | None = None) -> list[int]:
        try:
            with quiet_length_warning():  # run() checks the context itself, in one line
                return chat_prompt_ids(
                    self.pair.tokenizer, self.messages(user, history), thinking=self.thinking
                )
        except DFlash2Error:
            raise
        except Exception as exc:  # noqa: BLE001 - a Jinja template error, say what it was
            raise ParameterError(f"the chat template failed: {type(exc).__name__}: {exc}") from None

    def fitted_prompt(self, user: str) -> tuple[list[int], int]:
        """The prompt of `user` after the conversation. Where it leaves the answer less than
        max_tokens of the context (at most a quarter of it: a max_tokens near the context
        would drop every turn), the oldest turns are dropped (said in a note) until it leaves
        a quarter of the context more, or none is left: the next turns then reuse the cached
        conversation, where dropping one turn a turn changed its start every time and each
        prefilled it all again. They are dropped only if the prompt then fits (a message too
        long for any conversation loses nothing). `room` cuts the answer to what is left."""
        context = default_context_length(self.pair.model)
        want = min(self.max_tokens, context // 4)
        kept, ids = self.history, self.prompt_ids(user)
        goal = want + context // 4 if context - len(ids) < want else want
        fitting = None
        while kept and context - len(ids) < goal:
            kept = kept[2:]  # one turn: a user message and its answer
            ids = self.prompt_ids(user, kept)
            if fitting is None and context - len(ids) >= want:
                fitting = kept, ids  # the fewest turns dropped
        if context - len(ids) < goal and fitting is not None:  # no quarter to free: keep those
            kept, ids = fitting
        room = self.room(len(ids))  # refuses a prompt that still fills the context
        dropped = (len(self.history) - len(kept)) // 2
        if dropped:
            self.history = kept
            self.note(
                f"the conversation reached the model's {context:,}-token context: its "
                + ("oldest turn was" if dropped == 1 else f"{dropped} oldest turns were")
                + " dropped (/clear starts anew)"
            )
        return ids, room

    # ----------------------------------------------------------------- one turn
    def turn(self, user: str, live: bool) -> tuple[str, GenerationStats, str]:
        """Answer `user`; returns (text, stats of this answer, finish reason)."""
        ids, room = self.fitted_prompt(user)
        params = self.params(ids, room)
        stats, finish = GenerationStats(), "length"
        reply = ThinkingSplit(self.pair.tokenizer, ids)
        self.thinking_shown = False
        view = AnswerView(self.console) if live else None
        self.prefilling = len(ids) - self.session.reusable(ids)  # the rest: the cache's
        if view:
            view.__enter__()  # until the first token: what a long prompt is waiting for
            prefill = f"prefilling {self.prefilling:,} prompt tokens…"
            view.update("", Text(prefill, style="dim"), True)
        try:
            with StopFlag() as stop:
                chunks = stream_text(
                    self.pair, ids, params, session=self.session, cancel=lambda: stop.set
                )
                try:
                    for chunk in chunks:
                        stats.add(chunk.event)
                        self.total.add(chunk.event)
                        finish = chunk.finish_reason or finish
                        self.show(reply.feed(chunk.text), view, self.status(stats))
                        if stop.set:
                            finish = "stopped"
                            break
                finally:
                    chunks.close()
                if stop.set:  # also during the prefill, which then yields nothing
                    finish = "stopped"
        except KeyboardInterrupt:  # a second Ctrl-C: the engine may be mid-round
            finish = "interrupted"
            self.session = self.pair.new_session()
        except SystemExit:  # the terminal closed, or a kill (terminal.ends_on_hangup)
            finish = "stopped"
            if not live:  # its status line, as the turn's end would write it
                self.end_unshown(stats, finish)
            raise
        finally:
            self.show(reply.finish(), view, self.status(stats, finish))
            if view:
                view.update("", self.status(stats, finish), force=True)
                view.__exit__(None, None, None)
        if finish == "interrupted":
            self.note(
                "interrupted mid-round: the cache was reset (the next turn prefills "
                "the conversation again)"
            )
        text, thought = reply.answer_text, reply.thinking_text
        if text or thought or finish != "stopped":  # stopped before its first token: no turn
            answer = {"role": "assistant", "content": text}
            if thought:  # the template keeps or drops it (Qwen's drop it from the history)
                answer["reasoning_content"] = thought
            self.history += [{"role": "user", "content": user}, answer]
            self.turns += 1
        return text, stats, finish

    def show(self, pieces, view, status) -> None:
        """A reply's pieces: the thinking dimmed, on its own lines; piped, the answer alone on
        stdout (the thinking on stderr, where the statuses go)."""
        for kind, text in pieces:
            thinking = kind == THINKING
            ends_thought = self.thinking_shown and not thinking  # the answer: a line of its own
            if view:
                view.update("\n" * ends_thought + text, status, style="dim italic" * thinking)
            else:
                sys.stderr.write("\n" * ends_thought)
                out = sys.stderr if thinking else sys.stdout
                out.write(text)
                out.flush()
            self.thinking_shown = thinking
        if view and not pieces:
            view.update("", status)

    def end_unshown(self, stats, finish) -> None:
        """A reply streamed as is (piped, --prompt) ends its line; its status goes to stderr,
        on a line of its own after thinking that a cut left there."""
        sys.stdout.write("\n")
        sys.stdout.flush()
        if self.thinking_shown:
            sys.stderr.write("\n")
            self.thinking_shown = False
        self.err.print(self.status(stats, finish), soft_wrap=True)

    def settings(self) -> dict:
        sp = self.sampling
        return {
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k,
            "min_p": sp.min_p,
            "seed": sp.seed,
            "max tokens": self.max_tokens,
            "block": f"{self.block.size} (trained {self.trained}){self.block.falls()}",
            "speculative": "on" if self.spec else "off",
            "context lookup": (
                f"after a repeat of the last {self.pair.decoder.lookup} tokens"
                if self.pair.decoder.lookup
                else "off"
            ),
            "thinking": thinking_shown(self.pair.tokenizer, self.thinking),
            "thinking budget": "-" if self.thinking_budget is None else self.thinking_budget,
            "repetition penalty": self.repetition_penalty or "-",
            "system": self.system or "-",
        }

    # ----------------------------------------------------------------- the loop
    def repl(self) -> int:
        line_editing()
        piped = not sys.stdin.isatty()
        say = (self.console if interactive() else self.err).print  # hints: where the user looks
        if hasattr(sys.stdin, "reconfigure"):  # a stray byte is one refused line, not a crash
            sys.stdin.reconfigure(errors="surrogateescape")
        first = True
        while True:
            try:
                line = read_line("" if piped else ">>> ")  # piped: answers alone
                if first:  # a file saved with a byte order mark (Notepad): not the user's text
                    line, first = line.removeprefix("\ufeff"), False
            except EOFError:
                if piped:  # stdout holds the answers alone; a script sees its failed lines
                    return 2 if self.failures else 0
                say()  # past the prompt
                return 0
            except KeyboardInterrupt:
                say(Text("\n(Ctrl-D or /exit quits)", style="dim"))
                continue
            if not line.strip():
                continue
            if utf8_problem(line):
                self._bad(f"the line {utf8_problem(line)}; nothing was sent")
                continue
            if is_command(line):
                if not self.command(line):
                    return 2 if piped and self.failures else 0
                continue
            line = sent_text(line)
            # a dumb terminal (Emacs' shell) redraws nothing: the answer streams as piped
            live = self.console.is_terminal and not self.console.is_dumb_terminal
            try:
                with keys_unechoed() if live else nullcontext():
                    _, stats, finish = self.turn(line, live=live)
                if not live:
                    self.end_unshown(stats, finish)
                if piped and finish in ("stopped", "interrupted"):  # Ctrl-C ends a script
                    return 130
            except DFlash2Error as exc:
                self._bad(str(exc))
