"""One generation request: check lengths, reserve a queue place, tokenize (off the event loop,
one at a time), check the context, queue, then answer whole or as SSE.

A client that leaves is noticed while the request waits or generates (non-streaming: polled;
streaming: Starlette cancels the response) and its job is cancelled, freeing the worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..engine.events import GenerationStats
from ..text import quiet_length_warning
from .chat_prompt import ChatPrompt, ChatTemplate
from .choices import handle_choices
from .fim import completion_ids, fim_ids
from .format import ChatStream, Formatter, ReplyStats, usage
from .limits import RequestLimits
from .plan import past_window, plan
from .logprobs import EchoedPrompt, LogprobChunks, Logprobs
from .queue import Item, Job, QueueFull, ShuttingDown, Worker
from .reply import ChatReply
from .messages_output import MessageBuilder, MessagesStream
from .messages_output import usage as messages_usage
from .response_items import RecentItems
from .responses_output import ResponseBuilder, ResponsesStream
from .responses_output import usage as responses_usage
from .api_error import loggable, unknown_model
from .constrained import reply_constraint
from .schemas import APIError, GenRequest
from .server_settings import ServerSettings
from .http_errors import (
    CLIENT_GONE,
    error_response,
    from_worker,
    internal_error,
    log_level,
    shutting_down,
)
from .stream import PENDING, SSE_KEEPALIVE, UNREAD, Reader, SSEResponse

log = logging.getLogger("dflash2.serve")


async def echo_scores(item: Item, lp: Logprobs, reader: Reader, watch_client=False, timeout=None):
    """A "scores" item (an echoed prompt's log-probabilities, before its completion's) given
    to `lp`; the item after it."""
    lp.echo_prompt(reader.job.echo, item.event)
    return await reader.next(watch_client=watch_client, timeout=timeout)


class Handler:
    def __init__(
        self,
        pair,
        worker: Worker,
        settings: ServerSettings,
        chat: ChatTemplate,
        limits: RequestLimits,
    ):
        self.pair, self.worker, self.s, self.chat = pair, worker, settings, chat
        self.limits = limits
        self.recent_items = RecentItems(max_resolved=limits.body_bytes)  # item_reference's
        self.fim = fim_ids(pair.tokenizer, settings.vocab)  # a completion's `suffix` (fim.py)
        # what skip_special_tokens hides: the tokenizer's special tokens (its EOS, BOS, ...)
        self.special_ids = frozenset(getattr(pair.tokenizer, "all_special_ids", None) or ())
        # One tokenization at a time: a burst of long prompts cannot multiply the memory.
        self.tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="dflash2-tokenize")

    # ------------------------------------------------------------------ before the queue
    def chat_prompt(self, req: GenRequest) -> ChatPrompt:
        return self.chat.prompt(
            req.messages, req.tools, req.template_kwargs, req.prefill, req.generation_prompt
        )

    def tokenize(self, req: GenRequest) -> list[int]:
        """A completion's prompt ids (fim.py: with a `suffix`, the fill-in-the-middle ones)."""
        with quiet_length_warning():  # the context is checked by the caller (a 400)
            return completion_ids(self.pair.tokenizer, self.fim, self.s.vocab, req)

    def predicted_ids(self, req: GenRequest) -> tuple[int, ...]:
        if not req.prediction:
            return ()
        return tuple(self.pair.tokenizer.encode(req.prediction, add_special_tokens=False))

    # ------------------------------------------------------------------ the request
    async def handle(self, request: Request, req: GenRequest) -> Response:
        try:
            return await self._handle(request, req)
        except APIError as err:
            raise err if req.rename is None else req.rename(err) from None
        except Exception as e:  # a server bug: answer 500 (counted), keep serving
            log.exception("request failed")
            raise internal_error(e) from None

    async def count_tokens(self, req: GenRequest) -> dict:
        """The prompt tokens of a chat request (Anthropic's count_tokens), nothing generated."""
        if not self.s.serves(req.model):
            raise unknown_model(req.model, self.s.model_name)
        self.limits.check_text(req)
        self.reserve()  # a place while it tokenizes: a flood of them is a 503, as generations
        loop = asyncio.get_running_loop()
        try:
            prompt = await loop.run_in_executor(self.tokenizer_thread, self.chat_prompt, req)
        except APIError as err:
            raise err if req.rename is None else req.rename(err) from None
        finally:
            self.worker.unreserve()
        return {"input_tokens": len(prompt.ids)}

    def _encode(self, req: GenRequest):
        """(chat prompt or None, prompt ids, stop strings, predicted ids, grammar or None,
        the echoed prompt or None)."""
        prompt, stop = None, req.stop
        if req.kind == "chat":
            prompt = self.chat_prompt(req)
            ids, stop = prompt.ids, stop + list(prompt.stops)
        else:
            ids = self.tokenize(req)
        predicted = self.predicted_ids(req)
        self.limits.check_tokens(req, ids, predicted)  # before a grammar compiles for nothing
        constraint = reply_constraint(self.pair, req, prompt, self.s.thinking_budget)
        echo = EchoedPrompt.of(self.pair.tokenizer, ids) if req.echo else None
        return prompt, ids, stop, predicted, constraint, echo

    def reserve(self, count: int = 1) -> None:
        """Places in the queue, or a 503 (full: with Retry-After; shutting down)."""
        try:
            self.worker.reserve(count)
        except QueueFull as e:
            raise APIError(
                503,
                str(e),
                type="server_error",
                code="queue_full",
                headers={"Retry-After": str(e.retry_after)},
            ) from None
        except ShuttingDown:
            raise shutting_down() from None

    async def queue_job(self, req: GenRequest) -> tuple[Job, ChatPrompt | None, int]:
        """Reserve a place (503 when full), tokenize in it, queue the job; (job, chat prompt,
        prompt length). A request waiting to be tokenized holds its place."""
        self.limits.check_text(req)
        self.reserve()
        try:
            loop = asyncio.get_running_loop()
            prompt, ids, stop, predicted, grammar, echo = await loop.run_in_executor(
                self.tokenizer_thread, self._encode, req
            )
            params = plan(self.s, req, ids, predicted, grammar)
            score = req.logprobs if req.echo else None  # the prompt's own, echoed first
            hidden = self.special_ids if req.skip_special_tokens else frozenset()
            job = Job(ids, params, stop, score, req.max_tokens != 0, hidden)
            job.echo = echo
            job.preamble = prompt.preamble if prompt is not None else 0
        except BaseException:
            self.worker.unreserve()
            raise
        try:
            self.worker.submit(job)
        except ShuttingDown:
            raise shutting_down() from None
        return job, prompt, len(ids)

    async def _handle(self, request: Request, req: GenRequest) -> Response:
        if not self.s.serves(req.model):
            raise unknown_model(req.model, self.s.model_name)
        if req.n > 1 or req.prompts:
            return await handle_choices(self, request, req)
        job, prompt, n_prompt = await self.queue_job(req)
        reader = Reader(job, request)

        def release():
            reader.release(self.worker)

        handed_over = False
        try:
            wait = self.limits.keepalive_s if req.stream else None
            first = await reader.next(watch_client=True, timeout=wait)
            if first is None:
                return Response(status_code=CLIENT_GONE)
            if first.kind == "error":
                return error_response(from_worker(first.error), request)
            fmt = Formatter(req.kind, self.s.model_name)
            reply = (
                None if prompt is None else ChatReply.for_request(self.pair.tokenizer, prompt, req)
            )
            lp = self.logprobs_of(req, job)
            if req.stream:
                handed_over = True
                stream = self.stream_lines(fmt, req, n_prompt, first, reader, reply, lp)
                return SSEResponse(stream, release)
            body = await self.complete(fmt, req, n_prompt, first, reader, reply, lp)
            return body if isinstance(body, Response) else JSONResponse(body)
        finally:
            if not handed_over:
                release()

    def logprobs_of(self, req: GenRequest, job: Job) -> Logprobs | None:
        if req.logprobs is None:
            return None
        tok, stop_ids = self.pair.tokenizer, self.pair.eos_ids
        return Logprobs(tok, req.kind, stop_ids, job.prompt_ids, hidden=job.hidden)

    def usage_of(
        self,
        req: GenRequest,
        n_prompt: int,
        stats: GenerationStats,
        reply: ReplyStats | None,
        context: int | None = None,
    ) -> dict:
        """`usage` of `n_prompt` prompt tokens; its block is the one for a prompt of
        `context` tokens (default: n_prompt; a completions batch: its first prompt's)."""
        sampling = self.s.sampling.complete(req.sampling_fields)
        block = self.s.usage_block(sampling, n_prompt if context is None else context)
        return usage(n_prompt, stats, block, self.s.speculative, reply)

    def _finished(self, reply: ChatReply, replies: list | None = None) -> ReplyStats:
        """A finished chat reply's statistics, counted in /metrics (and added to `replies`)."""
        counted = ReplyStats(len(reply.calls), reply.thinking.stats)
        metrics = self.worker.metrics
        metrics.count_reply(counted.tool_calls, reply.unparsed, counted.thinking, reply.dropped)
        if replies is not None:
            replies.append(counted)
        return counted

    async def complete(
        self,
        fmt: Formatter,
        req: GenRequest,
        n_prompt: int,
        item: Item | None,
        reader: Reader,
        reply: ChatReply | None,
        lp: Logprobs | None = None,
        stats=None,  # GenerationStats, or one choice's share of several (choices.py)
        replies: list | None = None,
    ) -> dict | Response:
        """The whole response's body (a Response when the client left or the job failed)."""
        stats = GenerationStats() if stats is None else stats
        parts, deltas, finish, sent, stop = [], [], "length", 0, None
        echo = reader.job.echo
        if echo is not None:
            parts, sent = [echo.text], len(echo.text)
        while True:
            if item is None:
                return Response(status_code=CLIENT_GONE)
            if item.kind == "error":
                return error_response(from_worker(item.error), reader.request)
            if item.kind == "done":
                break
            if item.kind == "scores":
                item = await echo_scores(item, lp, reader, watch_client=True)
                continue
            stats.add(item.event)
            if lp is not None:
                lp.add(item.event)
            sent, stop = sent + len(item.text), item.stop or stop
            if reply is not None:
                deltas += reply.feed(item.text, item.event)
            else:
                parts.append(item.text)
            finish = item.finish_reason or finish
            item = await reader.next(watch_client=True)
        logprobs = lp.take(sent, whole=True) if lp is not None else None
        if reply is None:
            usage_ = self.usage_of(req, n_prompt, stats, None)
            return fmt.full("".join(parts), finish, usage_, logprobs=logprobs)
        more, finish = reply.finish(finish, stop)
        usage_ = self.usage_of(req, n_prompt, stats, self._finished(reply, replies))
        if req.responses is not None:
            builder = self._response_builder(req)
            return builder.whole(deltas + more, finish, responses_usage(usage_))
        if req.anthropic:
            message = MessageBuilder(
                self.s.model_name, req.stop, past_window(self.s, req, n_prompt)
            )
            return message.whole(deltas + more, finish, stop, messages_usage(usage_))
        return fmt.full(
            "".join(reply.content),
            finish,
            usage_,
            reasoning="".join(reply.reasoning),
            tool_calls=reply.calls,
            logprobs=logprobs,
        )

    def _response_builder(self, req: GenRequest) -> ResponseBuilder:
        """A /v1/responses object, repeating the sampling values this request ran with."""
        used = self.s.sampling.complete(req.sampling_fields)
        echo = {**req.responses, "temperature": used.temperature, "top_p": used.top_p}
        args = (self.s.model_name, echo, req.encrypted_reasoning, req.tool_namespaces)
        return ResponseBuilder(*args, keep=self.recent_items.add)

    def _stream_of(self, fmt, req: GenRequest, n_prompt: int, reply, lp, closing: bool):
        """The SSE lines' maker of the request's API (`closing`: it sends usage and [DONE])."""
        if req.responses is not None:
            return ResponsesStream(self._response_builder(req))
        if req.anthropic:
            window = past_window(self.s, req, n_prompt)
            return MessagesStream(MessageBuilder(self.s.model_name, req.stop, window), n_prompt)
        tools = reply is not None and reply.tools is not None
        return ChatStream(fmt, req.include_usage, LogprobChunks(lp), closing, tools)

    async def stream_lines(
        self,
        fmt: Formatter,
        req: GenRequest,
        n_prompt: int,
        item: Item,
        reader: Reader,
        reply: ChatReply | None,
        lp: Logprobs | None = None,
        stats=None,  # as in _complete; given: one choice of several (no usage, no [DONE])
        replies: list | None = None,
    ):
        out = self._stream_of(fmt, req, n_prompt, reply, lp, closing=stats is None)
        stats = GenerationStats() if stats is None else stats
        if item is UNREAD:  # keep-alives only once keepalive_s passes without it
            item = await reader.next(watch_client=False, timeout=self.limits.keepalive_s)
        while item is PENDING:  # headers are sent: keep the connection alive until it comes
            yield SSE_KEEPALIVE
            item = await reader.next(watch_client=False, timeout=self.limits.keepalive_s)
        finish, stop = "length", None
        for line in out.start(item):
            yield line
        if reader.job.echo is not None:  # the prompt first, with its log-probabilities
            if item.kind == "scores":
                item = await echo_scores(item, lp, reader, timeout=self.limits.keepalive_s)
            for line in out.echo(reader.job.echo.text):
                yield line
        quiet = time.monotonic()  # since the client last got a line
        while item.kind in ("chunk", "pending"):  # Starlette watches the client
            if item.kind == "chunk":
                stats.add(item.event)
                finish, stop = item.finish_reason or finish, item.stop or stop
                for line in out.item(item, reply):
                    quiet = time.monotonic()
                    yield line
            if time.monotonic() - quiet >= self.limits.keepalive_s:  # a call held to its end
                quiet = time.monotonic()
                yield SSE_KEEPALIVE
            item = await reader.next(watch_client=False, timeout=self.limits.keepalive_s)
        if item.kind == "error":  # headers are sent: report it in the stream, then end it
            err = from_worker(item.error)
            log.log(
                log_level(err.status),
                "stream ended by %d %s: %s",
                err.status,
                err.code,
                loggable(err.message),
            )
            for line in out.error(err):
                yield line
            return
        deltas, counted = [], None
        if reply is not None:
            deltas, finish = reply.finish(finish, stop)
            counted = self._finished(reply, replies)
        for line in out.end(deltas, finish, self.usage_of(req, n_prompt, stats, counted)):
            yield line
