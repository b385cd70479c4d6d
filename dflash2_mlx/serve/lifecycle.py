"""Running the app under uvicorn, and shutting it down gracefully.

On Ctrl-C (SIGINT), SIGTERM or SIGHUP: the listening socket closes (uvicorn); new requests on open
connections and every request still waiting in the queue get a JSON 503; the running
generations may finish for `grace` seconds, after which each is stopped: a stream ends with an
error event and `data: [DONE]`, a whole answer is a JSON 503. Then the worker stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import signal
import socket
import threading

import uvicorn

from .api_error import loggable
from .connections import timed_head_protocol
from .log_output import drain_logs, write_in_background
from .queue import ShuttingDown, Worker
from .request_ids import NameRequests
from .security import SecurityPolicy

log = logging.getLogger("dflash2.serve")

# uvicorn's own deadline comes after ours, so a stopped stream can still send its last events:
# a cut takes effect when the worker's current step ends (a prefill chunk or a round: seconds
# on a CPU or for a large model). uvicorn stops waiting as soon as the connections close, so
# the margin only bounds a hung one; a second Ctrl-C exits at once.
DELIVERY_MARGIN_S = 60.0
# Connections held at once; beyond, the longest idle are closed, else a JSON 503
# (serve/connections.py: a flood of connections would otherwise take every file descriptor).
MAX_CONNECTIONS = 1000
# Signals that drain and stop the server. uvicorn takes SIGINT and SIGTERM; SIGHUP (a closed
# terminal, `kill -HUP`) would otherwise end the process mid-stream, so it drains too where its
# handler is the default one (under nohup it is ignored, and stays so).
HANGUP = getattr(signal, "SIGHUP", None)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# An idle connection is kept longer than clients keep theirs (httpx's pool, which the openai
# and anthropic SDKs use, drops one after 5 s): at uvicorn's 5 s the server could close one
# just as a client sent its next request on it ("Server disconnected without sending a
# response").
KEEP_ALIVE_S = 30
# Every line of the server's log starts with its time (a log kept by nohup or a service).
TIME = "%(asctime)s "


class Drain:
    """Shutdown state of one app (app.state.drain): begun once by the server."""

    def __init__(self, worker: Worker, grace_s: float):
        self.worker, self.grace_s = worker, grace_s
        self.draining = False
        self._stopped: asyncio.Event | None = None
        self._stopped_loop: asyncio.AbstractEventLoop | None = None  # the loop it waits on

    def stopped(self) -> asyncio.Event:
        """Set once the drain begins (uploads still coming are refused): an event of the
        running loop's (an Event waits on one loop only, and an app may be served again)."""
        loop = asyncio.get_running_loop()
        if self._stopped_loop is not loop:
            self._stopped, self._stopped_loop = asyncio.Event(), loop
            if self.draining:
                self._stopped.set()
        return self._stopped

    def begin(self) -> None:
        if self.draining:
            return
        self.draining = True
        if self._stopped is not None:
            self._stopped.set()
        self.worker.close()
        log.info(
            "shutting down: waiting requests answered 503; running generations have %g s",
            self.grace_s,
        )
        asyncio.get_running_loop().call_later(self.grace_s, self.cut_now)

    def cut_now(self) -> None:
        """The running generations stop at their next step (the grace is over, or an exit was
        forced)."""
        self.worker.cut(ShuttingDown())


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose shutdown first drains the app's queue (see the module doc)."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain
        self.stopped_by: int | None = None  # a signal that stopped it without ending the process

    async def shutdown(self, sockets=None) -> None:
        self.drain.begin()
        forced = asyncio.create_task(self._cut_when_forced())
        try:
            await super().shutdown(sockets)
        finally:
            forced.cancel()

    async def _cut_when_forced(self) -> None:
        """A forced exit (a second Ctrl-C, or `force_exit` set by an embedding program) stops
        the running generations now. uvicorn's own no longer does: from Python 3.12 on,
        closing its server waits for every open connection (asyncio.Server.wait_closed), so
        a running request held the process for the whole grace period."""
        while not self.force_exit:
            await asyncio.sleep(0.05)
        self.drain.cut_now()

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's, over STOP_SIGNALS and a default SIGHUP: each begins the drain; once
        stopped, the process ends as the signal would have ended it."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stops = STOP_SIGNALS
        if HANGUP is not None and signal.getsignal(HANGUP) is signal.SIG_DFL:
            stops += (HANGUP,)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def run(self, sockets=None) -> None:
        """uvicorn's, re-raising the captured signals once the event loop has closed: raised
        inside it (as uvicorn does), a Ctrl-C pressed twice cut the tasks still running with
        a KeyboardInterrupt and logged their tracebacks. A forced exit's tracebacks of the
        tasks it cancels are dropped (_QuitNow), for a program running it in a thread too."""
        quit_now = _QuitNow(self)
        logging.getLogger("uvicorn.error").addFilter(quit_now)
        try:
            super().run(sockets=sockets)
        finally:
            logging.getLogger("uvicorn.error").removeFilter(quit_now)
        drain_logs()
        for sig in reversed(self._captured_signals):
            signal.raise_signal(sig)
        # still here: the signal was ignored when the server started (a script's `&` job
        # ignores SIGINT) yet stopped it: `run` exits as that signal's status says
        self.stopped_by = next(iter(self._captured_signals), None)


# Loggers whose lines the server shows as its own: its own, the library's (a drafter made for
# another target) and asyncio's (accept errors, a task's unretrieved exception).
OWN_LOGGERS = ("dflash2", "dflash2_mlx", "asyncio")
_own_handler: logging.Handler | None = None


def show_logs(log_level: str) -> None:
    """The server's own lines (refusals, cancellations, shutdown) on stderr, as uvicorn's,
    and the library's and asyncio's the same way (with their time, at --log-level)."""
    from uvicorn.logging import DefaultFormatter

    global _own_handler
    level = log_level.upper() if log_level != "trace" else logging.DEBUG
    for name in ("dflash2", "dflash2_mlx"):
        logging.getLogger(name).setLevel(level)
    if _own_handler is None:  # one, whatever handlers an embedding program gave these loggers
        _own_handler = logging.StreamHandler()
        _own_handler.setFormatter(DefaultFormatter(TIME + "%(levelprefix)s %(message)s"))
        _own_handler.addFilter(NameRequests())
    handler = _own_handler
    handler.setLevel(level)
    for name in OWN_LOGGERS:
        if handler not in logging.getLogger(name).handlers:
            logging.getLogger(name).addHandler(handler)


def _log_config() -> dict:
    """uvicorn's logging, each line with its time."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = TIME + formatter["fmt"]
    return config


def make_server(app, *, log_level: str = "info") -> DrainingServer:
    """A server for an app made by `create_app`: its grace period, its forwarding policy."""
    show_logs(log_level)
    drain: Drain = app.state.drain
    security: SecurityPolicy = app.state.security
    config = uvicorn.Config(
        app,
        log_level=log_level,
        log_config=_log_config(),
        timeout_graceful_shutdown=drain.grace_s + DELIVERY_MARGIN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=MAX_CONNECTIONS,
        http=timed_head_protocol(app.state.limits.head_s),
        **security.uvicorn_options(),
    )  # which sets up uvicorn's logging: its lines and ours are then written by a thread
    write_in_background([*OWN_LOGGERS, "uvicorn", "uvicorn.access"])
    return DrainingServer(config, drain)


def _more_files() -> None:
    """The soft limit on open files up to the hard one (macOS starts at 256), so the
    connection limit is reached before the descriptors run out. macOS refuses a limit past
    kern.maxfilesperproc (10,240 on a fresh install) even under an unlimited hard one: the
    next lower value is tried then."""
    try:
        import resource
    except ImportError:  # no such limit here
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = min(hard if hard != resource.RLIM_INFINITY else 65536, 65536)
    for want in (top, 10240, 4096):
        if soft == resource.RLIM_INFINITY or soft >= want or want > top:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return
        except (ValueError, OSError):  # not allowed: a lower one may be
            pass


class _Sometimes(logging.Filter):
    """asyncio logs every failed accept() with a traceback when descriptors run out (one a
    connection attempt: tens of MB a minute); one a minute is enough to see it."""

    def __init__(self, every_s: float = 60.0):
        super().__init__()
        self.every_s, self.last = every_s, -every_s

    def filter(self, record: logging.LogRecord) -> bool:
        if "out of system resource" not in str(record.msg):
            return True
        now = record.created
        if now - self.last < self.every_s:
            return False
        self.last = now
        return True


_ACCEPT_ERRORS = _Sometimes()


class _ShortPaths(logging.Filter):
    """uvicorn's access lines quote the request target whole (16 KB a line, refused junk
    included): cut to what a log line of this server's own holds, control characters escaped."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:  # (client, method, path, version, status)
            path = str(args[2])
            short = loggable(path, 200) + ("..." if len(path) > 200 else "")
            record.args = (args[0], loggable(args[1], 20), short, *args[3:])
        return True


_ACCESS_PATHS = _ShortPaths()


class _QuitNow(logging.Filter):
    """After a second Ctrl-C (quit now: uvicorn's force exit), drops uvicorn's tracebacks of
    the tasks cancelled as the event loop closes: every open stream and the lifespan logged
    one, as if it had failed (the lifespan's comes as text). Before it, nothing is dropped."""

    def __init__(self, server: uvicorn.Server):
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.server.force_exit:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError):
            return False
        return not str(record.msg).rstrip().endswith("CancelledError")


def _said_tcp(sock: socket.socket) -> socket.socket:
    """`sock` (taken over) as a socket that says it is TCP: asyncio sets TCP_NODELAY on a
    connection only then, and one made by a bare socket.socket() says protocol 0: each
    response then waited ~40 ms on the client's delayed ACK (Nagle's algorithm)."""
    ip = sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
    if not ip or sock.proto != 0:
        return sock
    return socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())


def run(app, sock: socket.socket, *, log_level: str = "info") -> int:
    """Serve on a bound socket until Ctrl-C, SIGTERM or SIGHUP; the exit code (130 after
    Ctrl-C)."""
    _more_files()
    logging.getLogger("asyncio").addFilter(_ACCEPT_ERRORS)  # once: the same filter object
    logging.getLogger("uvicorn.access").addFilter(_ACCESS_PATHS)
    server = make_server(app, log_level=log_level)
    try:
        server.run(sockets=[_said_tcp(sock)])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it captured once it has shut down
        return 130
    return 128 + int(server.stopped_by) if server.stopped_by is not None else 0
