"""A request's generation as the worker sees it (`Job`), and what it sends back (`Item`)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from ..engine.generation import GenerationParams
from .request_ids import REQUEST_ID

_job_ids = itertools.count(1)


class QueueFull(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy; retry in {retry_after} s")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    def __init__(self):
        super().__init__("the server is shutting down")


@dataclass
class Item:
    """What the worker sends back: a chunk of text, then "done"; or one "error"."""

    kind: str  # "scores" | "chunk" | "done" | "error" ("pending": serve/stream.py, never queued)
    text: str = ""
    finish_reason: str | None = None
    event: object = None  # the RoundEvent of a chunk; the prompt's TokenLogprobs of "scores"
    error: BaseException | None = None
    stop: str | None = None  # the stop string that ended a chunk's text


class Job:
    """`score`: the prompt's own log-probabilities are sent first (a "scores" item, with that
    many alternatives a token; None: not scored); `generate`: False for a prompt that is only
    scored or echoed (max_tokens 0); `hidden`: generated ids that are not text."""

    def __init__(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        stop: Sequence[str],
        score: int | None = None,
        generate: bool = True,
        hidden: frozenset[int] = frozenset(),
    ):
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.stop = list(stop)
        self.score, self.generate = score, generate
        self.hidden = hidden  # token ids that are not text (skip_special_tokens)
        self.echo = None  # the HTTP side's: a completion's echoed prompt (logprobs.EchoedPrompt)
        self.preamble = 0  # prompt ids other conversations share (chat_prompt.ChatPrompt's)
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue[Item] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.state = "waiting"  # waiting -> running -> done, or waiting -> cancelled
        self.stopped_by: BaseException | None = None  # the server stopped it (not the client)
        self.id = next(_job_ids)
        # in log lines: the request's id (its x-request-id), else the job's number
        self.name = REQUEST_ID.get() or f"job {self.id}"
        self.submitted = time.perf_counter()  # reset when queued (Worker.submit)
        self.began: float | None = None  # when it started running (Worker.begin)

    def emit(self, item: Item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.cancelled.set()
