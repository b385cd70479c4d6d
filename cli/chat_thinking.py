"""A chat reply as its thinking and its answer, while it streams.

A thinking model's reply opens with one thinking section (between the tokenizer's think
markers, or after a start marker the prompt wrote): the chat shows it dimmed, keeps it out of
a piped answer, and gives it back to the template as the turn's `reasoning_content` (which a
Qwen-style template drops from the history). Markers later in the answer are shown as its
text; the server (serve/reply.py, as mlx-lm's) moves a later section to `reasoning_content`
instead, for clients that show interleaved thinking apart.
"""

from __future__ import annotations

from mlx_lm.generate import TextStateMachine

from dflash2_mlx.chat_template import thinking_left_open, thought_piece

THINKING, ANSWER = "thinking", "answer"


class ThinkingSplit:
    def __init__(self, tokenizer, prompt_ids: list[int]):
        start = getattr(tokenizer, "think_start", None)
        end = getattr(tokenizer, "think_end", None)
        self.state = None  # the marker machine's, until the section is over
        self.marker = {"reasoning": start, "normal": end}  # what entered each state
        if getattr(tokenizer, "has_thinking", False) and start and end:
            machine = TextStateMachine(
                {"normal": [(start, "reasoning")], "reasoning": [(end, "normal")]}
            )
            opened = thinking_left_open(tokenizer, list(prompt_ids))
            self.state = machine.make_state("reasoning" if opened else "normal")
        self.thought: list[str] = []
        self.answer: list[str] = []
        self.lead = ""  # whitespace before the reply shows whether it thinks
        self.tail = ""  # the thinking's trailing newlines, held until more of it comes
        self.after = False  # the section closed and no answer text came yet

    def feed(self, text: str) -> list[tuple[str, str]]:
        """The pieces of `text`: (THINKING or ANSWER, text), in order."""
        if self.state is None:
            return self._answer(text)
        self.state, segments = TextStateMachine.split(self.state, text)
        return self._pieces(segments)

    def finish(self) -> list[tuple[str, str]]:
        """What the machine held back (part of a marker that never came whole)."""
        if self.state is None:
            return []
        self.state, rest, state = TextStateMachine.flush(self.state)
        out = self._pieces([(state, rest)])
        if self.state is not None and self.lead and not self.thought:  # whitespace alone
            out += self._answer(self.lead)
        self.state = None
        return out

    def _pieces(self, segments) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for i, (state, text) in enumerate(segments):
            if state == "reasoning":
                out += self._thinking(text)
            elif self.thought or text.strip():  # the section closed, or the answer began
                self.after = bool(self.thought)
                lead = "" if self.thought else self.lead
                self.state = None  # first section only: markers later are the answer's text
                # the machine split the rest of this text at markers: they are answer text
                rest = "".join(self.marker[s] + t for s, t in segments[i + 1 :])
                return out + self._answer(lead + text + rest)
            else:
                self.lead += text
        return out

    def _thinking(self, text: str) -> list[tuple[str, str]]:
        body, self.tail = thought_piece(text, not self.thought, self.tail)
        if not body:
            return []
        self.thought.append(body)
        return [(THINKING, body)]

    def _answer(self, text: str) -> list[tuple[str, str]]:
        if self.after:  # the newlines a template puts after the section
            text = text.lstrip("\n")
            self.after = not text
        if not text:
            return []
        self.answer.append(text)
        return [(ANSWER, text)]

    @property
    def thinking_text(self) -> str:
        return "".join(self.thought)

    @property
    def answer_text(self) -> str:
        return "".join(self.answer)
