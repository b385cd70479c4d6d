"""Text in, text out: chat templates, streaming detokenization and stop strings.

Shared by the chat front end and the server, so both stop, count and report identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from .engine.events import GenerationStats, RoundEvent
from .engine.loop import GenerationParams, Session
from .errors import ParameterError


def chat_prompt_ids(tokenizer, messages: Sequence[dict], *, thinking: bool | None = None,
                    add_generation_prompt: bool = True, tools: Sequence[dict] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of `messages` under the model's chat template.

    `thinking` is passed as `enable_thinking` (Qwen3-style templates) when not None; `tools`
    (OpenAI function tools) and `template_kwargs` go to the template as they are.
    """
    if not messages:
        raise ParameterError("messages is empty: at least one message is needed")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise ParameterError(
                f"messages[{i}] must be an object with a 'role' and a string 'content'")
    if not getattr(tokenizer, "chat_template", None):
        if tools:
            raise ParameterError("tools need a chat template; this model has none")
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return list(tokenizer.encode(text + ("\nassistant:" if add_generation_prompt else "")))
    kwargs: dict[str, Any] = dict(template_kwargs or {})
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    if tools:
        kwargs["tools"] = list(tools)
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                        tokenize=True, **kwargs)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


@dataclass
class TextChunk:
    """What one round added: new text (after stop-string handling) and the raw event."""

    text: str
    event: RoundEvent
    finish_reason: str | None = None  # "stop" (EOS or stop string) | "length" | None


@dataclass
class TextResult:
    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(default_factory=GenerationStats)


class TextStream:
    """Turns round events into text, cutting at the first stop string (never emitted).

    Text that could be the start of a stop string is held back until it is decided.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        if isinstance(stop, str):
            stop = [stop]
        self.stop = [s for s in stop if s]
        self.detok = tokenizer.detokenizer if hasattr(tokenizer, "detokenizer") else None
        if self.detok is None:
            from mlx_lm.tokenizer_utils import TokenizerWrapper
            self.detok = TokenizerWrapper(tokenizer).detokenizer
        self.detok.reset()
        self.sent = 0  # chars of the decoded text already emitted
        self.stopped = False

    def _decoded(self) -> str:
        return self.detok.text

    def feed(self, tokens: list[int], final: bool) -> tuple[str, bool]:
        """Add tokens; return (text safe to emit now, hit a stop string)."""
        for t in tokens:
            self.detok.add_token(t)
        if final:
            self.detok.finalize()
        text = self._decoded()
        for s in self.stop:
            i = text.find(s, max(0, self.sent - len(s) + 1))
            if i != -1:
                out = text[self.sent:i]
                self.sent = i
                self.stopped = True
                return out, True
        hold = 0
        if not final:
            for s in self.stop:  # longest suffix of text that is a proper prefix of s
                for k in range(min(len(s) - 1, len(text) - self.sent), 0, -1):
                    if text.endswith(s[:k]):
                        hold = max(hold, k)
                        break
        end = len(text) - hold
        out = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out, False


def stream_text(pair, prompt_ids: Sequence[int], params: GenerationParams,
                stop: Sequence[str] = (), session: Session | None = None) -> Iterator[TextChunk]:
    """Generate and yield text per round; stops at EOS, a stop string or max_tokens."""
    ts = TextStream(pair.tokenizer, stop)
    hidden = params.stop_token_ids or pair.eos_ids  # end-of-turn tokens are not text
    events = pair.stream(prompt_ids, params, session)
    try:
        for ev in events:
            visible = [t for t in ev.tokens if t not in hidden]
            text, hit = ts.feed(visible, final=ev.finish_reason is not None)
            if hit:
                yield TextChunk(text, ev, "stop")
                return
            yield TextChunk(text, ev, ev.finish_reason)
            if ev.finish_reason:
                return
    finally:
        events.close()


def generate_text(pair, prompt_ids: Sequence[int], params: GenerationParams,
                  stop: Sequence[str] = (), session: Session | None = None) -> TextResult:
    parts: list[str] = []
    tokens: list[int] = []
    stats = GenerationStats()
    finish = "length"
    for chunk in stream_text(pair, prompt_ids, params, stop, session):
        parts.append(chunk.text)
        tokens.extend(chunk.event.tokens)
        stats.add(chunk.event)
        finish = chunk.finish_reason or finish
    return TextResult("".join(parts), tokens, finish, stats)
