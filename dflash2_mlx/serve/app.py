"""The OpenAI-compatible HTTP server: one model, one worker thread running up to `max_batch`
requests together (serve/scheduler.py), a bounded queue.

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages (SSE
streaming or not), POST /v1/messages/count_tokens, GET /v1/models, GET /v1/models/{id},
GET /health, GET /metrics (Prometheus text).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import defaults
from ..engine.budget import can_budget
from ..engine.generation import GenerationParams, check_block_by_context, check_block_by_temperature
from ..engine.prompt_cache import PromptCache
from ..errors import DFlash2Error, ParameterError
from ..settings import Drafting, SamplingDefaults, check_block, check_falling
from ..target.context import default_context_length
from ..values import is_int
from . import metrics as metrics_mod
from .api_error import loggable, unknown_model
from .body import ClientGone, read_json
from .connections import say_once_a_minute
from .count_responses import CountResponses
from .chat_prompt import ChatTemplate
from .guard import FaultGuard
from .handler import Handler
from .server_settings import ServerSettings
from .http_errors import CLIENT_GONE, error_response
from .lifecycle import Drain
from .limits import RequestLimits, ServeLimits
from .queue import Worker
from .schemas import APIError, GenRequest, parse_chat, parse_completion
from .messages_request import parse_count_tokens, parse_messages
from .model_card import model_card
from .responses_request import parse_responses
from .security import SecurityGate, SecurityPolicy

log = logging.getLogger("dflash2.serve")


# path -> method of every endpoint (GET ones answer HEAD too)
ROUTES = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/responses": "POST",
    "/v1/messages/count_tokens": "POST",  # before /v1/messages: metrics match prefixes
    "/v1/messages": "POST",
    "/v1/models": "GET",
    "/health": "GET",
    "/metrics": "GET",
}
ENDPOINTS = tuple(ROUTES)


def display_name(name: str | None) -> str | None:
    """A folder's name instead of its path: responses never show the server's filesystem."""
    if name is None:
        return None
    if os.path.isabs(os.path.expanduser(name)) or name.startswith(".") or Path(name).exists():
        return Path(name).name or name
    return name


def create_app(
    pair,
    *,
    model_name: str,
    other_names: tuple[str, ...] = (),
    max_queue: int = defaults.MAX_QUEUE,
    max_batch: int = defaults.MAX_BATCH,
    context_length: int | None = None,
    default_max_tokens: int | None = None,
    drafting: Drafting | None = None,
    target_name: str | None = None,
    drafter_name: str | None = None,
    sampling: SamplingDefaults | None = None,
    thinking: bool | None = None,
    thinking_budget: int | None = None,
    prompt_cache_mb: int = defaults.PROMPT_CACHE_MB,
    width_cost: Callable[[int, int], float] | None = None,
    limits: ServeLimits | None = None,
    security: SecurityPolicy | None = None,
) -> FastAPI:
    """An app serving `pair` (a dflash2_mlx.api.Pair) as `model_name` (a request's `model`
    may also say one of `other_names`: an alias's synonyms, its target's repo id).

    max_queue: requests that may wait while others generate (beyond: 503 + Retry-After).
    max_batch: requests generating together in one batched speculative loop (engine/batch.py;
    1: one at a time; a target that cannot be batched runs one at a time whatever it is).
    context_length: prompt + max_tokens limit (default: the target's max_position_embeddings,
    else 4096). default_max_tokens: for requests that give none, clipped to what the context
    leaves (None: all it leaves, as OpenAI's API).
    drafting: how every request drafts (speculation on or off, the block, the lookup block, the
    profile's schedules by context and temperature and its verify cost: settings.Drafting; a
    front end's is `EngineSettings.drafting`; None: `pair.drafting`, load_pair's).
    target_name, drafter_name: shown in /v1/models (a path shows as its last part).
    sampling: what a request gets for the sampling fields it leaves out
    (dflash2_mlx.settings.resolve_sampling; default: greedy).
    thinking: the `enable_thinking` of requests that do not set it in chat_template_kwargs
    (None: the template's own default; refused if the template has no such switch).
    thinking_budget: the most tokens a reply's thinking section may hold when a request does
    not say (engine/budget.py; 0: an empty section; None: no limit; refused for a model
    without thinking markers).
    prompt_cache_mb: memory for the engine state of recent conversations, reused by prompt
    prefix across requests (engine/prompt_cache.py); 0: off.
    width_cost: cost(rows, width) of a batched verify (settings.EngineSettings.width_cost);
    None: `pair.width_cost` (load_pair's: the profile's, else engine/width.py's default model).
    limits: body size, prompt / prediction / stop lengths, shutdown grace (serve/limits.py);
    security: hosts, origins, API key (serve/security.py). The worker thread starts and stops
    with the app (its lifespan).
    """
    limits = limits or ServeLimits()
    security = security or SecurityPolicy()
    trained = pair.drafter.config.block_size
    drafting = _checked_drafting(pair.drafting if drafting is None else drafting, trained)
    _check_serve_args(max_queue, max_batch, default_max_tokens, prompt_cache_mb)
    _check_pair(pair, thinking_budget)
    if context_length is not None and not is_int(context_length, 2):
        raise DFlash2Error(f"context_length must be an int >= 2; got {context_length!r}")
    context = context_length or default_context_length(pair.model)
    if context < 2:  # a model's own
        raise DFlash2Error(f"context_length must be >= 2; got {context}")
    settings = ServerSettings(
        model_name,
        context,
        default_max_tokens,
        drafting,
        trained,
        pair.vocab_size,
        sampling or SamplingDefaults(),
        thinking_budget,
        tuple(other_names),
    )
    chat = ChatTemplate(pair.tokenizer, thinking)
    metrics = metrics_mod.Metrics(model_name)
    worker = _start_worker(pair, max_queue, metrics, prompt_cache_mb, max_batch, width_cost)
    # a hybrid target's prompt cache also keeps the state where a chat's system messages and
    # tools end (an attention target's trims to any prefix: nothing to find)
    cache = worker.scheduler.prompt_cache
    chat.find_preamble = cache is not None and not cache.trimmable
    handler = Handler(pair, worker, settings, chat, RequestLimits(limits, pair.tokenizer, context))
    drain = Drain(worker, limits.shutdown_grace_s)
    card = model_card(
        pair,
        settings,
        worker,
        chat,
        created=int(time.time()),
        target=display_name(target_name),
        drafter=display_name(drafter_name),
        max_queue=max_queue,
        thinking=thinking,
        prompt_cache_mb=prompt_cache_mb,
    )

    app = FastAPI(
        title="dflash2",
        lifespan=_lifespan(handler),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # a 307 would not be in the API's error shape: a 404 is
    )
    app.state.worker, app.state.metrics, app.state.settings = worker, metrics, settings
    app.state.limits, app.state.security, app.state.drain = limits, security, drain
    app.state.card = card  # the model object /v1/models lists
    _add_error_handlers(app)
    _add_routes(app, handler, drain, card, limits)
    _add_middleware(app, metrics, security)
    return app


def _add_middleware(app: FastAPI, metrics, security: SecurityPolicy) -> None:
    """Outermost last: every response is counted, refusals included; faults become JSON
    500s."""
    app.add_middleware(FaultGuard)
    app.add_middleware(SecurityGate, policy=security)
    app.add_middleware(CountResponses, metrics=metrics, endpoints=ENDPOINTS)


def _check_pair(pair, thinking_budget) -> None:
    """A pair that can serve text, and a thinking budget it can hold (DFlash2Error)."""
    if pair.tokenizer is None:  # requests are text: nothing could be served
        raise DFlash2Error(
            "create_app: the pair has no tokenizer (Pair.from_models(model, tokenizer, ...))"
        )
    if thinking_budget is None:
        return
    if not is_int(thinking_budget, 0):
        raise DFlash2Error(f"thinking_budget must be an int >= 0; got {thinking_budget!r}")
    if not can_budget(pair.tokenizer):
        raise DFlash2Error("--thinking-budget: this model has no thinking section to budget")


def _lifespan(handler: Handler):
    """The app's lifespan: the worker thread runs while the app does."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        handler.worker.start()
        try:
            yield
        finally:
            handler.worker.stop()
            handler.tokenizer_thread.shutdown(wait=False, cancel_futures=True)

    return lifespan


def _checked_drafting(d: Drafting, trained: int) -> Drafting:
    """`d` with its schedules checked (a ParameterError naming the field), before anything
    is built."""
    if not isinstance(d, Drafting):
        raise ParameterError(f"drafting must be a dflash2_mlx.settings.Drafting, got {d!r}")
    GenerationParams(  # as every request's params would be refused
        block_size=d.block,
        lookup_block=d.lookup_block,
        speculative=d.speculative,
        block_by_context=d.by_context,
        verify_cost=d.verify_cost,
    )
    for value in [d.block] + [b for _, b in d.by_context]:
        if value is not None:
            check_block(value, trained, "block_size")
    by_temperature = check_block_by_temperature(d.by_temperature)
    if by_temperature and not d.speculative:
        raise ParameterError("block_by_temperature has no effect with speculative=False")
    for _, value in by_temperature:
        check_block(value, trained, "block_by_temperature")
    check_falling(d.block or trained, by_temperature, "block_by_temperature")
    return replace(  # no block: the trained one, said in every request (not pair.drafting's)
        d,
        block=d.block or (trained if d.speculative else None),
        by_context=check_block_by_context(d.by_context),
        by_temperature=by_temperature,
    )


def _check_serve_args(max_queue, max_batch, default_max_tokens, prompt_cache_mb) -> None:
    """Refuses a bad server setting before anything is built (DFlash2Error)."""
    if not is_int(max_queue, 0):
        raise DFlash2Error(f"max_queue must be an int >= 0; got {max_queue!r}")
    if not is_int(max_batch, 1):
        raise DFlash2Error(f"max_batch must be an int >= 1 (1: one at a time); got {max_batch!r}")
    if default_max_tokens is not None and not is_int(default_max_tokens, 1):
        raise DFlash2Error(f"default_max_tokens must be an int >= 1; got {default_max_tokens!r}")
    if not is_int(prompt_cache_mb, 0):
        raise DFlash2Error(f"prompt_cache_mb must be an int >= 0 (0: off); got {prompt_cache_mb!r}")


def _start_worker(pair, max_queue, metrics, prompt_cache_mb, max_batch, width_cost) -> Worker:
    """The worker (not yet started) with its prompt cache; warns if requests cannot be batched."""
    prompt_cache = PromptCache(pair.decoder, prompt_cache_mb << 20) if prompt_cache_mb else None
    if prompt_cache is not None:
        metrics.prompt_cache = prompt_cache.stats
    worker = Worker(pair, max_queue, metrics, prompt_cache, max_batch, width_cost)
    if worker.scheduler.batch.fallback and max_batch > 1:
        log.warning(
            "requests run one at a time on this target: %s", worker.scheduler.batch.fallback
        )
    return worker


def _add_error_handlers(app: FastAPI) -> None:
    """API errors, uploads cut short and routing errors (404, 405) as OpenAI-style replies."""

    @app.exception_handler(APIError)
    async def _api_error(request, err: APIError):
        return error_response(err, request)

    @app.exception_handler(ClientGone)
    async def _client_gone(request, exc: ClientGone):
        say_once_a_minute(  # a flood's connections closed to make room would each write one
            f"{loggable(request.method, 20)} {loggable(request.url.path, 200)}: the client closed "
            "the connection during its upload (said once a minute at most)",
            logging.INFO,
            key="upload cut",
        )
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"{loggable(request.method, 20)} {request.url.path[:100]}: {exc.detail}"
        if exc.status_code == 404:
            msg += _not_found_hint(request.url.path)
        err = APIError(exc.status_code, msg, code=code, headers=exc.headers)  # 405: Allow
        return error_response(err, request)


SERVED = ", ".join(f"{method} {path}" for path, method in ROUTES.items())


def _not_found_hint(path: str) -> str:
    """What a client that missed should call instead: a base URL without /v1 is the usual
    slip; stored responses are not kept, so none can be fetched."""
    bare = path.rstrip("/")
    if bare != path and bare in ENDPOINTS:
        return f". Did you mean {bare}? (without the trailing slash)"
    path = bare
    if "/v1" + path in ENDPOINTS:
        return f". Did you mean /v1{path}? (a client's base URL ends in /v1)"
    if path.startswith("/v1/responses/"):
        return ". Responses are not stored: only POST /v1/responses is served"
    return f". This server serves {SERVED}"


def _add_routes(app: FastAPI, handler: Handler, drain: Drain, card: dict, limits) -> None:
    """The endpoints (ENDPOINTS); generation goes to `handler`, `card` is the model object."""
    _add_info_routes(app, handler, drain, card)
    _add_generation_routes(app, handler, limits, drain.stopped)


def _add_info_routes(app: FastAPI, handler: Handler, drain: Drain, card: dict) -> None:
    """The GET endpoints: the models (`card`), health and metrics."""
    worker, model_name = handler.worker, card["id"]
    GET = ["GET", "HEAD"]  # HEAD: the headers of the GET (uvicorn sends no body)

    @app.api_route("/v1/models", methods=GET)
    async def list_models():  # OpenAI's list, with Anthropic's paging fields
        return {
            "object": "list",
            "data": [card],
            "has_more": False,
            "first_id": model_name,
            "last_id": model_name,
        }

    @app.api_route("/v1/models/{model_id:path}", methods=GET)
    async def get_model(model_id: str):
        model_id = model_id.removesuffix("/")  # /v1/models/ID/ as clients that join paths send
        if not model_id:
            return await list_models()
        if not handler.s.serves(model_id):
            raise unknown_model(model_id, model_name)
        return card

    @app.api_route("/health", methods=GET)
    async def health():
        ok = worker.alive and not drain.draining
        status = "ok" if ok else ("shutting_down" if drain.draining else "error")
        body = {
            "status": status,
            "model": model_name,
            "queue_depth": worker.waiting,
            "in_flight": worker.running,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.api_route("/metrics", methods=GET)
    async def get_metrics():
        return PlainTextResponse(worker.metrics.render(), media_type=metrics_mod.CONTENT_TYPE)


def _add_generation_routes(app: FastAPI, handler: Handler, limits, stopped) -> None:
    """The POST endpoints: each request body read within `limits` (refused once the event
    `stopped()` gives is set: shutting down), then given to `handler`."""

    async def parsed(request: Request, parse, *args) -> GenRequest:
        """The body read within `limits`, parsed off the event loop (a body's parse may take
        seconds; the loop serves every other client meanwhile)."""
        body = await read_json(request, limits.max_body_bytes, limits.body_stall_s, stopped())
        return await run_in_threadpool(parse, body, *args)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handler.handle(request, await parsed(request, parse_chat))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handler.handle(request, await parsed(request, parse_completion))

    @app.post("/v1/responses")
    async def responses(request: Request):
        req = await parsed(request, parse_responses, handler.recent_items)
        return await handler.handle(request, req)

    @app.post("/v1/messages")
    async def messages(request: Request):
        return await handler.handle(request, await parsed(request, parse_messages))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        return await handler.count_tokens(await parsed(request, parse_count_tokens))
