"""`dflash2 serve`: an OpenAI-compatible HTTP server for one target + drafter pair.

Added to the main app with `register(app)`. MODEL, --target and --drafter resolve exactly as
for `dflash2 chat` (dflash2_mlx.registry). Model code is imported inside the command.
"""

from __future__ import annotations

from typing import List, Optional

import typer

from dflash2_mlx import defaults

from .common import (
    BlockOpt,
    ChatTemplateOpt,
    DraftVocabOpt,
    DrafterOpt,
    FullVocabOpt,
    LookupOpt,
    NoDatastoreOpt,
    MinPOpt,
    ModelArg,
    NoSpecOpt,
    OfflineOpt,
    SeedOpt,
    TargetOpt,
    TempOpt,
    ThinkingOpt,
    TopKOpt,
    TopPOpt,
    fail,
    DraftingFlags,
    spec_engine_flags,
    sampling_flags,
)
from .serve_run import (
    context_notes,
    exit_after_shutdown,
    load_app,
    prepare_process,
    say,
    say_serving,
    url_host,
)

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


API_KEY_ENV = "DFLASH2_API_KEY"
BACKLOG = 2048  # uvicorn's


def _bind(host: str, port: int):
    """Bind the socket first: a port another server listens on is one line, before any model
    loads (clients are refused, not kept waiting, until it has loaded: _listen)."""
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        fail(f"cannot listen on {url_host(host)}:{port}: {e.strerror or e}")
    return sock


def _listen(sock, host: str, port: int) -> None:
    """Listen once the model has loaded. Two servers started on one port at once both bind
    (SO_REUSEADDR); the second to listen stops here with one line, before it says it serves."""
    try:
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        fail(
            f"cannot listen on {url_host(host)}:{port}: {e.strerror or e} "
            "(taken while the model loaded)"
        )


def serve(
    model: ModelArg = None,
    target: TargetOpt = None,
    drafter: DrafterOpt = None,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    model_name: Optional[str] = typer.Option(
        None,
        "--model-name",
        help="The id clients send as `model` (default: the alias, else the target's folder or "
        "repo name, without the path).",
    ),
    context_length: Optional[int] = typer.Option(
        None,
        "--context-length",
        min=2,
        help="Limit on prompt + max_tokens (default: the "
        "target's max_position_embeddings, else 4096).",
    ),
    max_tokens: Optional[int] = typer.Option(
        None,
        "--max-tokens",
        min=1,
        help="max_tokens of requests that give none (default, as OpenAI's API: what the "
        "context leaves on chat and responses, 16 on completions).",
    ),
    max_queue: int = typer.Option(
        defaults.MAX_QUEUE,
        "--max-queue",
        min=0,
        help="Requests that may wait while others generate; more get 503 with Retry-After.",
    ),
    max_batch: int = typer.Option(
        defaults.MAX_BATCH,
        "--max-batch",
        min=1,
        help="Requests generating together in one batched speculative loop (each exactly as "
        "alone); 1: one at a time. Targets that cannot be batched run one at a time. Each holds "
        "a KV cache as long as the longest in the batch: lower it where memory is short.",
    ),
    block: BlockOpt = None,
    no_spec: NoSpecOpt = False,
    temp: TempOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    seed: SeedOpt = None,
    prompt_cache_mb: int = typer.Option(
        defaults.PROMPT_CACHE_MB,
        "--prompt-cache-mb",
        min=0,
        help="Memory (MiB) for the "
        "engine state of recent conversations: a request extending a cached prefix prefills "
        "only its new tokens (least recently used out first). 0: off.",
    ),
    offline: OfflineOpt = False,
    full_vocab: FullVocabOpt = False,
    draft_vocab: DraftVocabOpt = None,
    lookup: LookupOpt = None,
    no_datastore: NoDatastoreOpt = False,
    thinking: ThinkingOpt = None,
    chat_template: ChatTemplateOpt = None,
    thinking_budget: Optional[int] = typer.Option(
        None,
        "--thinking-budget",
        min=0,
        help="Most tokens a reply may think when its request does not say (thinking_budget; "
        "exact: the end marker is then forced).",
    ),
    log_level: str = typer.Option(
        "info", "--log-level", help="uvicorn log level: " + ", ".join(LOG_LEVELS) + "."
    ),
    max_body_mb: float = typer.Option(
        defaults.MAX_BODY_MB,
        "--max-body-mb",
        min=0.001,
        max=4096.0,
        help="Largest request body in MiB; larger ones get 413 while being read.",
    ),
    max_prompt_tokens: Optional[int] = typer.Option(
        None,
        "--max-prompt-tokens",
        min=1,
        help="Longest prompt (default: what the context length allows).",
    ),
    max_prediction_tokens: Optional[int] = typer.Option(
        None,
        "--max-prediction",
        min=1,
        help="Longest `prediction` in tokens (default: the context length).",
    ),
    shutdown_grace: float = typer.Option(
        defaults.SHUTDOWN_GRACE_S,
        "--shutdown-grace",
        min=0,
        max=86400,  # finite: inf (or nan) would never end the server
        help="Seconds running generations may finish after Ctrl-C.",
    ),
    allowed_hosts: Optional[List[str]] = typer.Option(
        None,
        "--allowed-hosts",
        metavar="<str,...>",
        help="Host header values answered besides loopback names "
        "(comma-separated or repeated; * = any). The --host address is allowed already.",
    ),
    cors: Optional[List[str]] = typer.Option(
        None,
        "--cors",
        metavar="<str,...>",
        help="Browser origins allowed cross-origin, e.g. "
        "http://localhost:3000 (comma-separated or repeated; * = any).",
    ),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        envvar=API_KEY_ENV,
        show_envvar=True,
        help="Require `Authorization: Bearer KEY` (or `x-api-key: KEY`, as Anthropic's clients send) "
        "on every endpoint but /health. "
        "The environment variable keeps the key out of `ps`, which any local user can read.",
    ),
    trust_proxy: Optional[List[str]] = typer.Option(
        None,
        "--trust-proxy",
        metavar="<str,...>",
        help="Addresses of reverse proxies whose X-Forwarded-For / "
        "-Proto headers are believed (default: none).",
    ),
):
    """Serve a model over an OpenAI-compatible HTTP API (chat, completions, responses, Anthropic
    messages, models, metrics).

    Up to --max-batch requests generate together (joining and leaving between rounds, each
    exactly as alone); others wait in a bounded queue. Usage in every response
    carries acceptance stats in `usage.dflash2`; /v1/models shows the engine in `dflash2`.
    Tool calls (`tools`) and the reasoning split (`reasoning_content`) follow the model's own
    chat template and mlx-lm's tool parsers; --thinking/--no-thinking sets the default of a
    request's chat_template_kwargs.enable_thinking.

    --temp, --top-p, --top-k, --min-p and --seed are the defaults for the fields a request
    leaves out (its own fields always win); not given: the target's generation_config.json,
    else greedy. /v1/models shows them in `sampling_defaults`.

    Example: dflash2 serve qwen3-4b --port 8000

    Example: dflash2 serve --target ./model --drafter ./drafter --max-queue 4
    """
    prepare_process()
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it
        host = host[1:-1]
    log_level = log_level.lower()  # mlx_lm.server's spelling is INFO, DEBUG, ...
    if log_level not in LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}; got {log_level!r}")
    sampling = sampling_flags(temp, top_p, top_k, min_p, seed)
    drafting = DraftingFlags(block, lookup, no_datastore, full_vocab, draft_vocab)
    flags = spec_engine_flags(
        no_spec, drafting, sampling, chat_template, idle="no request can turn speculation on"
    )
    if model_name is not None and not model_name.strip():
        fail("--model-name is empty")
    if api_key is None and _env_is_empty(API_KEY_ENV):  # click reads an empty value as unset
        fail(f"{API_KEY_ENV} is set but empty: give the key, or unset it to serve without one")
    sock = _bind(host, port)  # before the model loads; listened on once it has (_listen)
    limits, security = _policies(
        host,
        max_body_mb,
        max_prompt_tokens,
        max_prediction_tokens,
        shutdown_grace,
        allowed_hosts,
        cors,
        api_key,
        trust_proxy,
    )
    pair, settings, app, name = load_app(
        sock,
        model,
        target,
        drafter,
        offline,
        flags,
        model_name,
        max_queue=max_queue,
        max_batch=max_batch,
        context_length=context_length,
        default_max_tokens=max_tokens,
        thinking=thinking,
        thinking_budget=thinking_budget,
        prompt_cache_mb=prompt_cache_mb,
        limits=limits,
        security=security,
    )
    context_notes(app.state.settings.context, pair, max_tokens, max_prompt_tokens, say)
    _listen(sock, host, port)
    say_serving(name, host, port, settings, app, max_queue, prompt_cache_mb, security)
    from dflash2_mlx.serve import run_server

    # After Ctrl-C: waiting requests get 503, the running ones --shutdown-grace seconds.
    exit_after_shutdown(run_server(app, sock, log_level=log_level))


def _env_is_empty(name: str) -> bool:
    import os

    return name in os.environ and not os.environ[name].strip()


def _items(values: Optional[List[str]], flag: str) -> tuple[str, ...]:
    """Repeated and comma-separated values, flattened; a value with none in it is refused
    (`--cors ''` would otherwise mean the same as no --cors)."""
    out = []
    for value in values or ():
        items = [v.strip() for v in value.split(",") if v.strip()]
        if not items:
            fail(f"{flag} {value!r} names nothing (give NAME[,NAME...], or leave the flag out)")
        out += items
    return tuple(out)


def _policies(
    host,
    max_body_mb,
    max_prompt_tokens,
    max_prediction_tokens,
    shutdown_grace,
    allowed_hosts,
    cors,
    api_key,
    trust_proxy,
):
    """The flags as ServeLimits and SecurityPolicy (serve/limits.py, serve/security.py)."""
    from dflash2_mlx.errors import DFlash2Error
    from dflash2_mlx.serve import SecurityPolicy, ServeLimits
    from dflash2_mlx.serve.security import WILDCARDS, hosts_for_bind, is_loopback

    hosts = hosts_for_bind(host, _items(allowed_hosts, "--allowed-hosts"))
    if host in WILDCARDS and not hosts:
        say(
            f"note: listening on {host}; requests are answered only when their Host names a "
            "loopback address (a client on the LAN gets 403: add --allowed-hosts NAME,...)"
        )
    if not is_loopback(host) and not api_key:
        say(
            f"warning: listening on {host} without --api-key: any client that reaches this "
            "port can use the model (the Host check stops browsers, not other programs); "
            "set --api-key (or DFLASH2_API_KEY) to require a key"
        )
    try:
        limits = ServeLimits(
            max_body_bytes=int(max_body_mb * 1024 * 1024),
            max_prompt_tokens=max_prompt_tokens,
            max_prediction_tokens=max_prediction_tokens,
            shutdown_grace_s=shutdown_grace,
        )
        security = SecurityPolicy(
            allowed_hosts=hosts,
            cors_origins=_items(cors, "--cors"),
            api_key=api_key,
            trusted_proxies=_items(trust_proxy, "--trust-proxy"),
        )
    except DFlash2Error as e:
        fail(str(e))
    return limits, security


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
