"""`dflash2 serve`'s run once its flags are checked and its socket bound: load the pair into an
app, the start notes, the line that says what is served, and the exit. Model code is imported
inside the functions, so `dflash2 --help` never loads it."""

from __future__ import annotations

import typer

from .loading import load_engine


def prepare_process() -> None:
    """The standard descriptors held open (closed at start, the listening socket took fd 2,
    where a C-level error message would then go), and a SIGINT ignored at start (a script's
    `&` job) stopping the model's load as it stops the server once serving."""
    import os
    import signal

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed: /dev/null takes the lowest free descriptor, this one
            os.open(os.devnull, os.O_RDWR)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def say(msg: str) -> None:
    """A startup line on stderr, with its time as every log line. If its reader has gone
    (`| head`, a log shipper that died), the server serves on and its lines go nowhere, as
    uvicorn's do after the start."""
    import logging
    import os
    import sys

    when = logging.Formatter().formatTime(logging.makeLogRecord({}))  # the log's %(asctime)s
    try:
        typer.echo(f"{when} {msg}", err=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())


def load_app(sock, model, target, drafter, offline: bool, flags, model_name, **options):
    """Load the pair and build its app (create_app with `options`): (pair, engine settings,
    app, the name served). The socket bound for it is closed if anything fails or is
    interrupted on the way."""
    from dflash2_mlx.registry import names_of
    from dflash2_mlx.serve import create_app, display_name

    try:
        pair, resolved, settings = load_engine(model, target, drafter, offline, say, flags)
        if settings.auto_block.note:
            say(f"note: {settings.auto_block.note}")
        name = model_name or display_name(resolved.name)  # a folder's name, not its path
        app = create_app(
            pair,
            model_name=name,
            other_names=names_of(resolved.alias) if resolved.alias else (),
            drafting=settings.drafting,
            target_name=resolved.target,
            drafter_name=resolved.drafter,
            sampling=settings.sampling,
            width_cost=settings.width_cost,
            **options,
        )
    except BaseException:
        sock.close()
        raise
    return pair, settings, app, name


def context_notes(context: int, pair, max_tokens, max_prompt_tokens, say) -> None:
    """Said at start: a context past what the model was trained on, limits it cannot reach."""
    from dflash2_mlx.target.context import trained_context_length

    trained = trained_context_length(pair.model)
    if trained is not None and context > trained:
        say(f"note: --context-length {context} is past the model's own {trained} tokens")
    for flag, value in (("--max-tokens", max_tokens), ("--max-prompt-tokens", max_prompt_tokens)):
        if value is not None and value > context - 1:
            say(f"note: {flag} {value} is more than the context allows: at most {context - 1} here")


def url_host(host: str) -> str:
    """A host as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def say_serving(
    name: str, host: str, port: int, settings, app, max_queue: int, prompt_cache_mb: int, security
) -> None:
    """The sampling defaults, then what is served where and how (`security`: the server's
    SecurityPolicy: an API key, the web origins allowed)."""
    say(f"sampling defaults (for fields a request leaves out): {settings.sampling.describe()}")
    say(
        f"serving {name!r} on http://{url_host(host)}:{port}/v1: "
        + (settings.block.describe() if settings.speculative else "speculative off")
        + f", context {app.state.settings.context}, batch {app.state.worker.capacity}"
        + f", queue {max_queue}, prompt cache "
        + (f"{prompt_cache_mb} MiB" if prompt_cache_mb else "off")
        + who_is_served(app.state.card, security)
    )


def who_is_served(card: dict, security) -> str:
    """The serving line's end: tool calls where the model has none, the API key, the
    cross-origin web pages answered (--cors)."""
    out = "" if card["dflash2"]["tool_calling"] else ", no tool calls (tools: a 400)"
    out += ", API key required" if security.api_key else ", no API key"
    origins = security.cors_origins
    if origins:
        out += ", web pages from " + ("any origin" if "*" in origins else ", ".join(origins))
    return out


def exit_after_shutdown(code: int) -> None:
    """Leave without the interpreter's teardown: the server and its worker thread are stopped
    by now, and MLX's static destructors can abort ("terminate called without an active
    exception", seen in CI) when threads that ran MLX work are torn down at exit."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
