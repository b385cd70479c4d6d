"""Several choices (`n` > 1) of one chat or completion request, or a completions request's
batch of prompts (`n` choices each): one job per choice.

A prompt's jobs share it (tokenized once) and generate side by side in the batch; a prompt's
choice j samples with seed + j when the request gives a seed (so the response is reproducible)
and with a seed of its own otherwise. A whole response lists every choice with its index
(prompt k's choice j: k * n + j, as OpenAI's); a stream interleaves the choices' chunks as they
come (each carries its index) and ends with one usage chunk and one [DONE]. `usage` counts
each prompt once and every choice's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..engine.events import GenerationStats, RoundEvent
from ..sampling import SEEDS
from .format import SSE_DONE, Formatter, ReplyStats, sse
from .http_errors import CLIENT_GONE, error_response, from_worker, shutting_down
from .queue import Job, ShuttingDown
from .reasoning import ThinkingStats
from .reply import ChatReply
from .schemas import APIError, GenRequest, invalid
from .stream import UNREAD, Reader, SSEResponse


class ChoiceStats:
    """One choice's view of the response's statistics: its rounds all count; its prefill
    only for the first choice (the prompt is the response's once)."""

    def __init__(self, shared: GenerationStats, first: bool):
        self.shared, self.first = shared, first

    def __getattr__(self, name: str):  # the statistics themselves are the shared ones
        return getattr(self.shared, name)

    def add(self, ev: RoundEvent) -> None:
        if ev.prefill and not self.first:
            ev = replace(ev, prompt_tokens=0, reused_tokens=0, prefill_ms=0.0, queue_ms=0.0)
        self.shared.add(ev)


def merged_replies(replies: list[ReplyStats]) -> ReplyStats | None:
    if not replies:
        return None
    thinking = ThinkingStats()
    for r in replies:
        t = r.thinking
        thinking.tokens += t.tokens
        thinking.rounds += t.rounds
        thinking.drafted += t.drafted
        thinking.accepted += t.accepted
    return ReplyStats(sum(r.tool_calls for r in replies), thinking)


async def _queue(handler, req: GenRequest) -> tuple[list[Job], object, list[int]]:
    """Every choice's place taken first (all or a 503), then for each prompt (a completions
    batch has several) its first choice's job queued as a request's and one more per choice
    with its seed; (jobs, chat prompt, each job's prompt length)."""
    prompts = req.prompts or [req.prompt]
    worker, extra = handler.worker, len(prompts) * req.n - 1
    most = worker.max_queue + worker.capacity
    if extra >= most:  # before anything is made per prompt: there may be a million
        field = "n" if req.prompts is None else "prompt"
        raise invalid(
            field, f"{extra + 1} choices are more than this server takes at once ({most})"
        )
    subs = [replace(req, prompt=p, prompts=None) for p in prompts]
    handler.reserve(extra)
    jobs: list[Job] = []
    lengths: list[int] = []
    try:
        for k, sub in enumerate(subs):
            if k:
                extra -= 1  # queue_job takes a place of its own
                worker.unreserve()
            try:
                job, prompt, n_prompt = await handler.queue_job(sub)
            except APIError as err:  # a batch's prompt is named by its index
                if req.prompts and err.param == "prompt":
                    err.param = f"prompt[{k}]"
                raise
            jobs.append(job)
            lengths += [n_prompt] * req.n
            for i in range(1, req.n):
                extra -= 1  # submit takes the place, or gives it back when shutting down
                choice = _choice(job, i)
                worker.submit(choice)
                jobs.append(choice)  # submitted: cancelled below if a later one fails
    except BaseException as e:
        worker.unreserve(extra)
        for j in jobs:
            worker.cancel(j)
        if isinstance(e, ShuttingDown):
            raise shutting_down() from None
        raise
    return jobs, prompt, lengths


def _choice(job: Job, i: int) -> Job:
    """The prompt's choice i: its job with seed + i (when the request gives a seed)."""
    sp = job.params.sampling
    seed = None if sp.seed is None else (sp.seed + i) % SEEDS
    params = replace(job.params, sampling=replace(sp, seed=seed))
    choice = Job(job.prompt_ids, params, job.stop, job.score, job.generate, job.hidden)
    choice.echo, choice.preamble = job.echo, job.preamble
    return choice


async def _merged(streams) -> object:
    """The lines of several async generators as they come (each one's order kept)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(stream):
        try:
            async for line in stream:
                await queue.put(line)
            await queue.put(None)
        except BaseException as e:  # the consumer raises it (a fault, logged as a 500's)
            await queue.put(e)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        left = len(tasks)
        while left:
            line = await queue.get()
            if isinstance(line, BaseException):
                raise line
            if line is None:
                left -= 1
            else:
                yield line
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            with contextlib.suppress(Exception):
                await s.aclose()


async def handle_choices(handler, request: Request, req: GenRequest) -> Response:
    jobs, prompt, lengths = await _queue(handler, req)
    readers = [Reader(j, request) for j in jobs]
    # usage counts each prompt once; its block is the first prompt's
    prompt_tokens = (sum(lengths[:: req.n]), lengths[0])

    def release():
        for reader in readers:
            reader.release(handler.worker)

    handed_over = False
    try:
        wait = handler.limits.keepalive_s if req.stream else None
        first = await readers[0].next(watch_client=True, timeout=wait)
        if first is None:
            return Response(status_code=CLIENT_GONE)
        if first.kind == "error":
            return error_response(from_worker(first.error), request)
        fmt, tok = Formatter(req.kind, handler.s.model_name), handler.pair.tokenizer
        shared, replies = GenerationStats(), []
        args = []
        for i, (job, reader) in enumerate(zip(jobs, readers)):
            reply = None if prompt is None else ChatReply.for_request(tok, prompt, req)
            lp = handler.logprobs_of(req, job)
            item = first if i == 0 else UNREAD
            stats = ChoiceStats(shared, i % req.n == 0)  # a prompt's prefill counts once
            args.append((fmt.choice(i), req, lengths[i], item, reader, reply, lp, stats, replies))
        if req.stream:
            handed_over = True
            return SSEResponse(
                _stream(handler, fmt, req, prompt_tokens, args, readers, shared, replies), release
            )
        tasks = [asyncio.ensure_future(_whole(handler, a)) for a in args]
        try:
            pending = set(tasks)
            while pending:  # the first failure ends them all (its Response is the answer)
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if isinstance(t.result(), Response):
                        return t.result()
            bodies = [t.result() for t in tasks]
        finally:  # the others stop (their jobs are released below)
            for t in tasks:
                t.cancel()
        body = {**bodies[0], "choices": [b["choices"][0] for b in bodies]}
        total, context = prompt_tokens
        body["usage"] = handler.usage_of(req, total, shared, merged_replies(replies), context)
        return JSONResponse(body)
    finally:
        if not handed_over:
            release()


async def _whole(handler, args):
    fmt, req, n_prompt, item, reader, *rest = args
    if item is UNREAD:
        item = await reader.next(watch_client=True)
    return await handler.complete(fmt, req, n_prompt, item, reader, *rest)


class _ChoiceFailed(Exception):
    """A choice's stream ended with an error: the response ends with that error alone."""

    def __init__(self, lines: list[str]):
        super().__init__("a choice failed")
        self.lines = lines


async def _choice_lines(handler, args, reader: Reader):
    """One choice's lines; its error lines (what follows the reader's error item) are
    raised instead, so the merged stream reports one error and stops the other choices."""
    failure = []
    async for line in handler.stream_lines(*args):
        if reader.failed:
            failure.append(line)
        else:
            yield line
    if failure:
        raise _ChoiceFailed(failure)


async def _stream(handler, fmt, req, prompt_tokens, args, readers, shared, replies):
    try:
        lines = [_choice_lines(handler, a, r) for a, r in zip(args, readers)]
        async for line in _merged(lines):
            yield line
    except _ChoiceFailed as e:
        for line in e.lines:
            yield line
        yield SSE_DONE
        return
    if req.include_usage:
        total, context = prompt_tokens
        usage_ = handler.usage_of(req, total, shared, merged_replies(replies), context)
        yield sse(fmt.usage_chunk(usage_))
    yield SSE_DONE
