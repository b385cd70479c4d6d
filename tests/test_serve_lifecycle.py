"""`dflash2 serve` over time, on a real uvicorn server on 127.0.0.1: a client that leaves during
a long prefill frees the worker within a chunk; shutdown lets the running request finish,
answers waiting ones 503, and (Ctrl-C on a real process) ends a cut stream with an error event
and [DONE]; only loopback Hosts, same-origin or --cors origins, JSON bodies and the API key get
through; forwarding headers are not believed; Retry-After follows recent generations."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import tiny
from test_serve import HI, _open_long_stream, make_tokenizer, metric, reference, running, slow_pair

from dflash2_mlx.api import Pair
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.serve import SecurityPolicy, ServeLimits, create_app
from dflash2_mlx.serve.lifecycle import make_server
from dflash2_mlx.text import chat_prompt_ids

LONG_PROMPT = [5 + (i * 7) % 80 for i in range(3000)]


@pytest.fixture(scope="module")
def pair():
    """Prefill in chunks of 64 tokens: a 3000-token prompt is ~47 chunks."""
    return Pair.from_models(
        tiny.make_target("llama"),
        make_tokenizer(),
        tiny.make_drafter(2, block_size=4),
        prefill_chunk=64,
    )


@pytest.fixture
def logs(caplog):
    """caplog, also hearing uvicorn (whose loggers do not propagate to the root)."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="dflash2")  # a server made earlier may have raised it
    uv = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.access")]
    for lg in uv:
        lg.addHandler(caplog.handler)
    yield caplog
    for lg in uv:
        lg.removeHandler(caplog.handler)


@contextlib.contextmanager
def serving(app, log_level: str = "warning"):
    """`running`, but with the server `dflash2 serve` runs (make_server: drain on shutdown,
    its forwarding policy); yields (base URL, server, thread)."""
    # said to be TCP, so asyncio sets TCP_NODELAY (lifecycle._said_tcp): no ~40 ms a request
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    own = [logging.getLogger(name) for name in ("dflash2", "dflash2_mlx")]
    levels = [lg.level for lg in own]  # make_server sets them: restored after
    server = make_server(app, log_level=log_level)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread
    finally:
        server.should_exit = True
        thread.join(30)
        for lg, level in zip(own, levels):
            lg.setLevel(level)


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def health(base: str) -> dict:
    return httpx.get(base + "/health", timeout=10).json()


# ------------------------------------------------------------------ cancellable prefill
def test_library_cancel_stops_the_prefill_and_the_session_recovers(pair):
    calls = []
    session = pair.new_session()
    events = list(
        pair.stream(
            LONG_PROMPT[:300],
            GenerationParams(max_tokens=4),
            session,
            cancel=lambda: calls.append(1) or len(calls) > 1,  # before the second chunk
        )
    )
    assert events == [] and len(calls) == 2  # polled before the prefill, then after a chunk
    prompt = LONG_PROMPT[:100]
    out, _ = pair.generate(prompt, GenerationParams(max_tokens=6), session)  # reused session
    assert out == tiny.greedy_reference(pair.model, prompt, 6, eos=set(pair.eos_ids))


def test_client_leaving_during_a_long_prefill_frees_the_worker(logs):
    pair = slow_pair(0.03, prefill_chunk=64)  # 47 chunks: > 1.4 s of prefill anywhere
    t0 = time.perf_counter()  # what half of the long prompt's prefill costs, measured here
    first = pair.stream(LONG_PROMPT[:1500], GenerationParams(max_tokens=1))
    next(first)
    first.close()
    half_prefill = time.perf_counter() - t0
    app = create_app(pair, model_name="tiny", default_max_tokens=4)
    with running(app) as base:
        logs.set_level(logging.INFO, logger="uvicorn.access")  # uvicorn's config reset it
        logging.getLogger("uvicorn.access").addHandler(logs.handler)
        before = httpx.get(base + "/metrics").text
        with pytest.raises(httpx.ReadTimeout):  # leaves 0.5 s into its 3000-token prefill
            httpx.post(
                base + "/v1/completions",
                timeout=0.5,
                json={"prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0},
            )
        t0 = time.perf_counter()
        r = httpx.post(
            base + "/v1/completions",
            timeout=120,
            json={"prompt": "ab", "max_tokens": 3, "temperature": 0},
        )
        waited = time.perf_counter() - t0
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        after = httpx.get(base + "/metrics").text
    # The next request waited for a chunk at most, not for the rest of the prefill.
    assert waited < half_prefill, (waited, half_prefill)
    assert (
        metric(after, "dflash2_prompt_tokens_total") - metric(before, "dflash2_prompt_tokens_total")
    ) == 2  # the long one never ended
    assert (
        metric(after, "dflash2_cancelled_total") - metric(before, "dflash2_cancelled_total")
    ) == 1
    lines = [r.getMessage() for r in logs.records if "cancelled" in r.getMessage()]
    assert len(lines) == 1 and "prefill" in lines[0] and "client left" in lines[0], lines
    # the access log has its line too, as uvicorn writes one (it logs none for a response
    # its client never got)
    access = [r.getMessage() for r in logs.records if r.name == "uvicorn.access"]
    assert sum('"POST /v1/completions HTTP/1.1" 499' in a for a in access) == 1, access


# ------------------------------------------------------------------ shutdown
@pytest.mark.parametrize("max_batch", [1, 2])
def test_shutdown_lets_the_running_request_finish_and_refuses_the_waiting(pair, max_batch):
    """Every running request (one, or a batch of two) finishes; the waiting one gets 503."""
    app = create_app(
        pair,
        model_name="tiny",
        max_queue=4,
        max_batch=max_batch,
        limits=ServeLimits(shutdown_grace_s=60),
    )
    results: dict = {}

    def post(name, max_tokens):
        results[name] = httpx.post(
            base + "/v1/completions",
            timeout=120,
            json={"prompt": "abc", "max_tokens": max_tokens, "temperature": 0},
        )

    with serving(app) as (base, server, thread):
        runners = [
            threading.Thread(target=post, args=(f"running{i}", 2500)) for i in range(max_batch)
        ]
        for t in runners:
            t.start()
        wait_for(lambda: health(base)["in_flight"] == max_batch, what="the first requests to run")
        waiting_one = threading.Thread(target=post, args=("waiting", 4))
        waiting_one.start()
        wait_for(lambda: health(base)["queue_depth"] == 1, what="the next one to wait")
        server.should_exit = True  # what Ctrl-C does
        waiting_one.join(30)
        assert not any(k.startswith("running") for k in results), "a running request was cut"
        for t in runners:
            t.join(120)
        thread.join(30)
    refused = results["waiting"]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    for i in range(max_batch):
        done = results[f"running{i}"]
        assert done.status_code == 200, done.text
        usage = done.json()["usage"]
        assert (
            usage["completion_tokens"] == 2500
            or done.json()["choices"][0]["finish_reason"] == "stop"
        )


def test_a_cut_stream_of_several_choices_ends_with_one_error_and_done(pair):
    """n = 3 streamed choices stopped by the shutdown: one error event, one [DONE]."""
    app = create_app(pair, model_name="tiny", max_batch=4, limits=ServeLimits(shutdown_grace_s=0.3))
    with serving(app) as (base, server, thread), httpx.Client(timeout=60) as http:
        body = {"prompt": "abc", "max_tokens": 4000, "temperature": 0, "stream": True, "n": 3}
        with http.stream("POST", base + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            while '"text": "' not in (line := next(lines)) or '"text": ""' in line:
                pass
            server.should_exit = True
            rest = [line for line in lines if line.startswith("data: ")]
        thread.join(30)
    errors = [line for line in rest if '"error"' in line]
    assert len(errors) == 1 and json.loads(errors[0][6:])["error"]["code"] == "shutting_down"
    assert rest[-1] == "data: [DONE]" and rest.count("data: [DONE]") == 1
    assert rest[-2] == errors[0]


def test_sigint_ends_a_cut_stream_with_an_error_and_done(tmp_path):
    """A real process, a real Ctrl-C: the waiting requests get JSON 503 at once; the running
    stream gets its grace period (3 s), then an error event and [DONE]; the port closes; the
    exit code is 130; no traceback."""
    # one at a time: two wait; each forward >= 10 ms, so the stream outlasts the grace period
    # (4000 tokens of the tiny pair could end within 3 s on a fast machine)
    with _child_server("3.0", "1", "0.01") as (proc, base):
        results: list = []
        with httpx.Client(timeout=60) as http:
            cm, lines = _open_long_stream(http, base)
            threads = [
                threading.Thread(
                    target=lambda: results.append(
                        httpx.post(
                            base + "/v1/completions",
                            timeout=60,
                            json={"prompt": "q", "max_tokens": 2, "temperature": 0},
                        )
                    )
                )
                for _ in range(2)
            ]
            for t in threads:
                t.start()
            wait_for(lambda: health(base)["queue_depth"] == 2, what="two waiting requests")
            proc.send_signal(signal.SIGINT)
            t0 = time.time()
            for t in threads:
                t.join(30)
            answered = time.time() - t0
            rest = [line for line in lines if line.startswith("data: ")]
            ended = time.time() - t0
            cm.__exit__(None, None, None)
        assert [r.status_code for r in results] == [503, 503]
        assert all(r.json()["error"]["code"] == "shutting_down" for r in results)
        assert answered < 2.9  # before the grace period ended
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["error"]["code"] == "shutting_down"
        assert 2.9 <= ended < 15, ended
        with pytest.raises(httpx.TransportError):  # no longer accepting
            httpx.get(base + "/health", timeout=2)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert "cancelled" in err and "shutting down" in err


def test_a_second_ctrl_c_quits_at_once_without_tracebacks():
    """Ctrl-C twice (quit now, uvicorn's force exit) with a stream open: the process ends
    before the grace period, with 130 and no traceback. The captured Ctrl-C used to be raised
    inside the event loop, and the tasks it cut (the stream, the lifespan) logged theirs."""
    with _child_server("30.0", "1") as (proc, base):
        with httpx.Client(timeout=60) as http:
            cm, lines = _open_long_stream(http, base)
            t0 = time.time()
            proc.send_signal(signal.SIGINT)
            said = []  # the first is taken (the drain has begun) before the second is sent
            while "shutting down" not in (line := proc.stderr.readline()) and line:
                said.append(line)
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(httpx.HTTPError):
                for _ in lines:
                    pass
            cm.__exit__(None, None, None)
            _, rest = proc.communicate(timeout=30)
            err = "".join(said) + line + rest
    assert time.time() - t0 < 20  # not the 30 s grace period
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "CancelledError" not in err, err


def test_an_upload_still_coming_at_shutdown_is_refused_at_once():
    """A body still arriving when the drain begins is a 503 at once: it held the shutdown up
    to its stall timeout (30 s), or without end when it dripped, then ended in a 500 and a
    traceback."""
    with _child_server("3.0", "1") as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            head += "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            s.sendall(head.encode() + b'{"prompt": "a')
            time.sleep(0.5)  # the body is being read
            t0 = time.time()
            proc.send_signal(signal.SIGTERM)
            data = b""
            while part := s.recv(65536):
                data += part
        answered = time.time() - t0
        _, err = proc.communicate(timeout=30)
        ended = time.time() - t0
    assert data.startswith(b"HTTP/1.1 503"), data
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"] == "shutting_down"
    assert answered < 2.5 and ended < 10, (answered, ended)
    assert "Traceback" not in err, err


def test_a_second_ctrl_c_answers_a_waiting_request_in_json():
    """Quitting at once cuts a request still in its prefill: its client gets the JSON 503
    every other refusal is, not uvicorn's plain-text 500."""
    with _child_server("30.0", "1", "1.0") as (proc, base):  # each forward takes 1 s
        results: list = []
        body = {"prompt": "abc " * 20, "max_tokens": 50, "temperature": 0}
        post = threading.Thread(
            target=lambda: results.append(
                httpx.post(base + "/v1/completions", json=body, timeout=60)
            )
        )
        post.start()
        wait_for(lambda: health(base)["in_flight"] == 1, what="the request running")
        proc.send_signal(signal.SIGINT)
        while "shutting down" not in (line := proc.stderr.readline()) and line:
            pass
        proc.send_signal(signal.SIGINT)
        post.join(30)
        proc.communicate(timeout=30)
    (r,) = results
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text


def test_a_forced_exit_of_an_embedded_server_stops_its_generations_at_once():
    """A program that runs the server in a thread stops it with `should_exit`, then
    `force_exit`: from Python 3.12 on, uvicorn's force exit waited for every open connection,
    so a running request held the thread for the whole grace period (11 s of 10 in a
    reviewer's run); it is cut at once, its client answered the JSON 503, and the lifespan
    the forced exit cancels is not logged as a failure."""
    app = create_app(slow_pair(0.05), model_name="tiny", limits=ServeLimits(shutdown_grace_s=30))
    with serving(app) as (base, server, thread):
        results: list = []
        body = {"prompt": "abc", "max_tokens": 500, "temperature": 0, "logit_bias": {"2": -100}}
        post = threading.Thread(
            target=lambda: results.append(
                httpx.post(base + "/v1/completions", json=body, timeout=60)
            )
        )
        post.start()
        wait_for(lambda: health(base)["in_flight"] == 1, what="the request running")
        server.should_exit = True
        time.sleep(0.5)  # the drain has begun: the request runs on in its grace
        assert post.is_alive()
        errors: list[str] = []  # heard after the logger's filters, as its own handlers hear
        heard = logging.Handler(logging.ERROR)
        heard.emit = lambda record: errors.append(record.getMessage()[:200])
        logging.getLogger("uvicorn.error").addHandler(heard)
        started = time.monotonic()
        server.force_exit = True
        post.join(10)
        thread.join(10)
        logging.getLogger("uvicorn.error").removeHandler(heard)
        assert not thread.is_alive() and time.monotonic() - started < 5
    (r,) = results
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
    assert not errors, errors  # the tasks the forced exit cancels are not logged as failures


def test_an_idle_connection_outlives_the_clients_own_idle_expiry():
    """httpx's pool (the openai and anthropic SDKs') reuses a connection idle for up to 5 s;
    uvicorn closed them at 5 s, and a request sent just then met "Server disconnected
    without sending a response"."""
    with _child_server("0.5", "1") as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        ask = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()

        def answer(s) -> bytes:  # one whole response (its head, then content-length bytes)
            data = b""
            while b"\r\n\r\n" not in data:
                part = s.recv(4096)
                if not part:
                    return data  # closed: no response
                data += part
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
            while len(body) < length:
                body += s.recv(4096)
            return head

        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(ask)
            assert answer(s).startswith(b"HTTP/1.1 200")
            time.sleep(6)
            s.sendall(ask)
            assert answer(s).startswith(b"HTTP/1.1 200")


def _closed_by_server(s: socket.socket, within: float) -> bool:
    """True when the server closes `s` (reads drain whatever it sent) within `within` s."""
    s.settimeout(within)
    try:
        while s.recv(4096):
            pass
    except socket.timeout:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_request_head_that_does_not_come_in_time_closes_its_connection():
    """uvicorn times nothing before a request head, and its keep-alive timer stops at a next
    request's first byte: silent or trickling connections were held forever (a review's 999
    of them made every request a 503). Each must send a whole head within head_s of opening or
    of its last response; a request that runs longer than head_s is not cut."""
    app = create_app(slow_pair(0.3), model_name="tiny", limits=ServeLimits(head_s=0.5))
    with serving(app) as (base, _, _):
        port = int(base.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))
        trickling = socket.create_connection(("127.0.0.1", port))
        trickling.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        after_reply = socket.create_connection(("127.0.0.1", port))
        after_reply.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert after_reply.recv(4096).startswith(b"HTTP/1.1 200")
        after_reply.sendall(b"G")  # a next request's first byte: uvicorn's keep-alive timer stops
        after_413 = socket.create_connection(("127.0.0.1", port))  # a slow sender after a 413
        after_413.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 99999999\r\n\r\n{"
        )
        assert after_413.recv(4096).startswith(b"HTTP/1.1 413")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(5):  # a byte every 0.2 s (closed meanwhile: what is wanted)
                time.sleep(0.2)
                trickling.sendall(b"x")
                after_413.sendall(b"x")
        t0 = time.monotonic()
        for s in (silent, trickling, after_reply, after_413):
            assert _closed_by_server(s, 5), "the connection was still open"
            s.close()
        assert time.monotonic() - t0 < 5
        started = time.monotonic()
        r = httpx.post(
            base + "/v1/chat/completions", json={"messages": HI, "max_tokens": 8}, timeout=60
        )
        assert r.status_code == 200 and time.monotonic() - started > 0.5  # ran past head_s
    with pytest.raises(DFlash2Error, match="head_s must be > 0"):
        ServeLimits(head_s=0)


def _running(port: int) -> socket.socket:
    """A connection whose request generates (a long one): not one to close to make room."""
    s = socket.create_connection(("127.0.0.1", port))
    body = {"prompt": "abc", "max_tokens": 500, "temperature": 0, "logit_bias": {"2": -100}}
    body = json.dumps(body).encode()  # its end of turn banned: it runs ~25 s
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return s


def _bodiless(port: int) -> socket.socket:
    """A connection that sent a request head and no body: nothing generates yet."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    return s


def test_past_the_connection_limit_the_answer_is_the_apps_json_503(monkeypatch, logs):
    """uvicorn's own answer past its connection limit was a plain-text 503 without
    Retry-After, unlike every other refusal: SDKs saw an error of another shape. It comes
    when every connection has a request that generates (or waits its turn to)."""
    from dflash2_mlx.serve import connections, lifecycle

    monkeypatch.setattr(lifecycle, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(connections, "_SAID", {})  # not said yet in this process
    with serving(create_app(slow_pair(0.05), model_name="tiny")) as (base, _, _):
        port = int(base.rsplit(":", 1)[1])
        held = [_running(port) for _ in range(4)]
        wait_for(lambda: httpx.get(base + "/health").status_code == 503, what="the limit")
        r = httpx.get(base + "/health")
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.headers
        assert r.json()["error"]["code"] == "too_many_connections", r.text
        r = httpx.post(base + "/v1/messages", json={})  # Anthropic's shape on its path
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.headers
        assert r.json()["error"]["type"] == "overloaded_error" and r.json()["type"] == "error", (
            r.text
        )
        for s in held:
            s.close()
        wait_for(lambda: httpx.get(base + "/health").status_code == 200, what="room again")
    said = [r for r in logs.records if "requests are refused" in r.getMessage()]
    assert len(said) == 1, said  # once a minute at most, however many were refused


def test_at_the_connection_limit_the_longest_idle_connections_make_room(pair, monkeypatch, logs):
    """A client reopening sockets faster than the head deadline closed them, or sending
    request heads without their bodies, held every connection, and every other client got
    503s for as long as it kept on: a connection that opens at the limit closes those not
    generating that have gone longest without sending a byte."""
    from dflash2_mlx.serve import connections, lifecycle

    monkeypatch.setattr(lifecycle, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(connections, "_SAID", {})
    with serving(create_app(slow_pair(0.05), model_name="tiny")) as (base, _, _):
        port = int(base.rsplit(":", 1)[1])
        running = _running(port)
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a head, cut short
        time.sleep(0.05)
        bodiless = _bodiless(port)
        time.sleep(0.05)
        silent = socket.create_connection(("127.0.0.1", port))  # the latest to send (connect)
        time.sleep(0.05)
        with httpx.Client() as client:  # one connection: the fifth open one
            for _ in range(3):
                r = client.get(base + "/health")
                assert r.status_code == 200, r.text
        assert _closed_by_server(trickle, 5) and _closed_by_server(bodiless, 5)
        assert not _closed_by_server(silent, 0.5) and not _closed_by_server(running, 0.1)
        for s in (running, trickle, bodiless, silent):
            s.close()
    said = [r for r in logs.records if "the longest idle connections" in r.getMessage()]
    assert len(said) == 1, said


def test_a_sigint_that_was_ignored_at_start_still_exits_130():
    """A server started by a script with `&` starts with SIGINT ignored; SIGINT still stops
    it, and the exit code says so (it was 0, as if it had ended by itself)."""
    with _child_server("0.5", "1", ignored=(signal.SIGINT,)) as (proc, base):
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err


def test_an_access_line_quotes_a_long_path_short():
    """uvicorn's access line quoted a request's target whole (16 KB a line of junk traffic,
    in a log left to grow for weeks); it is cut as this server's own lines are."""
    with _child_server("0.5", "1") as (proc, base):
        assert httpx.get(base + "/" + "a" * 10_000, timeout=30).status_code == 404
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:  # a long method
            s.sendall(b"M" * 5000 + f" / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            assert s.recv(100).startswith(b"HTTP/1.1 404")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)  # uvicorn's access lines go to stdout
    (line,) = [x for x in out.splitlines() if "aaaa" in x]
    assert "404" in line and len(line) < 400 and "aaa... HTTP" in line, line
    long = [x for x in (out + err).splitlines() if "MMMM" in x]
    assert len(long) == 2 and all(len(x) < 700 for x in long), [len(x) for x in long]


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_sighup_drains_and_names_the_request_in_its_log():
    """SIGHUP (a closed terminal, `kill -HUP`) drains as SIGTERM does: the running stream gets
    its error event and [DONE] (uvicorn leaves SIGHUP at its default, which cut the stream
    mid-body), then the process ends by the signal. Every log line starts with its time, and
    the cancellation names the request by the x-request-id its client got."""
    with _child_server("0.5", "1") as (proc, base):
        with httpx.Client(timeout=60) as http:
            body = {"prompt": "abc", "max_tokens": 4000, "temperature": 0, "stream": True}
            with http.stream("POST", base + "/v1/completions", json=body) as r:
                rid, lines = r.headers["x-request-id"], r.iter_lines()
                while '"text": "' not in (line := next(lines)) or '"text": ""' in line:
                    pass
                proc.send_signal(signal.SIGHUP)
                rest = [line for line in lines if line.startswith("data: ")]
        _, err = proc.communicate(timeout=60)
    assert rest[-1] == "data: [DONE]", rest
    assert json.loads(rest[-2][6:])["error"]["code"] == "shutting_down"
    assert proc.returncode == -signal.SIGHUP and "Traceback" not in err, err
    logged = [line for line in err.splitlines() if "INFO" in line]
    assert logged and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", x) for x in logged), err
    (cut,) = [line for line in logged if "cancelled" in line]
    assert rid in cut and "shutting down" in cut, cut


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_sighup_is_taken_only_where_it_would_end_the_process():
    """Under nohup (SIGHUP ignored) or a caller's own handler, the server leaves SIGHUP as it
    is: closing the terminal of a `nohup dflash2 serve &` must not stop it."""
    import uvicorn

    from dflash2_mlx.serve.lifecycle import DrainingServer

    server = DrainingServer(uvicorn.Config(lambda scope, receive, send: None), drain=None)
    before = signal.getsignal(signal.SIGHUP)
    try:
        for given, taken in ((signal.SIG_IGN, False), (signal.SIG_DFL, True)):
            signal.signal(signal.SIGHUP, given)
            with server.capture_signals():
                assert (signal.getsignal(signal.SIGHUP) == server.handle_exit) is taken
            assert signal.getsignal(signal.SIGHUP) == given
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_cut_waits_for_a_long_step_to_end(tmp_path):
    """A cut takes effect when the worker's current step ends: a step longer than uvicorn's
    margin (2 s once) had the stream cancelled mid-step, no error event or [DONE], and a
    traceback in the log. Here every forward takes 3 s: the stream still ends cleanly."""
    with _child_server("0.2", "1", "3.0") as (proc, base):
        with httpx.Client(timeout=60) as http:
            cm, lines = _open_long_stream(http, base)  # a step has just begun
            proc.send_signal(signal.SIGINT)
            rest = [line for line in lines if line.startswith("data: ")]
            cm.__exit__(None, None, None)
        _, err = proc.communicate(timeout=60)
    assert rest[-1] == "data: [DONE]", rest
    assert json.loads(rest[-2][6:])["error"]["code"] == "shutting_down"
    assert proc.returncode == 130 and "Traceback" not in err, err


@contextlib.contextmanager
def _child_server(*args: str, ignored: tuple = ()):
    """tests/serve_child.py with `args` in a process of its own, up: (process, base URL).
    `ignored`: signals it starts with ignored (as a script's `&` job starts with SIGINT)."""
    child = Path(__file__).with_name("serve_child.py")
    proc = subprocess.Popen(
        [sys.executable, str(child), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: [signal.signal(s, signal.SIG_IGN) for s in ignored])
        if ignored
        else None,
        env={**os.environ, "SERVE_CHILD_INHERIT_SIGINT": "1"} if ignored else None,
    )
    try:
        base = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        wait_for(lambda: _up(base), 60, "the server to start")
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _up(base: str) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return httpx.get(base + "/health", timeout=1).status_code == 200
    return False


# ------------------------------------------------------------------ local by design
def test_hosts_origins_content_type_and_api_key(pair, logs):
    policy = SecurityPolicy(cors_origins=("http://localhost:3000",), api_key="s3cret")
    app = create_app(
        pair,
        model_name="tiny",
        default_max_tokens=2,
        security=policy,
        drafter_name="/srv/models/secret-dir/my-drafter",
    )
    key = {"Authorization": "Bearer s3cret"}
    body = {"messages": HI, "max_tokens": 2}
    with serving(app, log_level="info") as (base, _, _):
        for name in ("uvicorn", "uvicorn.access"):  # uvicorn's config reset their handlers
            logging.getLogger(name).addHandler(logs.handler)
        port = base.rsplit(":", 1)[1]

        def post(headers, **kw):
            return httpx.post(
                base + "/v1/chat/completions", headers={**key, **headers}, timeout=30, **kw
            )

        # Host: loopback names only (a DNS-rebound name is refused)
        for host, status in (
            (f"localhost:{port}", 200),
            (f"127.0.0.2:{port}", 200),
            (f"[::1]:{port}", 200),
            (f"127.0.0.1:{port}@evil.example", 400),  # malformed: not read as 127.0.0.1
            ("localhost:http", 400),
            (f"evil.example:{port}", 403),
            (f"192.168.1.5:{port}", 403),
        ):
            r = post({"Host": host}, json=body)
            assert r.status_code == status, (host, r.text)
            if status == 400:
                assert r.json()["error"]["code"] == "host_malformed"
        assert r.json()["error"]["code"] == "host_not_allowed"
        # no Host at all: HTTP/1.0 may leave it out (a bare probe; browsers always send it)
        for version, status in (("1.0", b" 200 "), ("1.1", b" 400 ")):
            with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as sock:
                sock.sendall(f"GET /health HTTP/{version}\r\n\r\n".encode())
                assert status in sock.recv(200).split(b"\r\n")[0] + b" ", version
        # Origin: cross-origin refused unless --cors names it; a text/plain "simple request"
        evil = {"Origin": "http://evil.example"}
        r = post({**evil, "Content-Type": "text/plain"}, content=json.dumps(body))
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in r.headers
        r = post(evil, json=body)
        assert r.status_code == 403
        r = post({"Origin": f"http://127.0.0.1:{port}"}, json=body)  # same origin
        assert r.status_code == 200
        # two Origin headers (no browser sends two): refused, whichever comes last
        with socket.create_connection(("127.0.0.1", int(port)), timeout=30) as sock:
            raw = json.dumps(body).encode()
            sock.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Origin: http://evil.example\r\nOrigin: http://127.0.0.1:{port}\r\n"
                f"Authorization: Bearer s3cret\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode()
                + raw
            )
            assert sock.recv(200).startswith(b"HTTP/1.1 400 "), "two Origin headers"
        ok = {"Origin": "http://localhost:3000"}
        r = post(ok, json=body)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ok["Origin"]
        assert "x-request-id" in r.headers["access-control-expose-headers"]  # the SDKs' id
        pre = httpx.options(
            base + "/v1/chat/completions",
            headers={
                **ok,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert pre.status_code == 204 and "POST" in pre.headers["access-control-allow-methods"]
        # an SDK's long list (~250 characters) comes back whole, name by name
        sdk = [f"x-stainless-{part}" for part in ("arch", "lang", "os", "package-version")]
        sdk += ["anthropic-version", "x-stainless-runtime-version", "x-stainless-timeout"]
        sdk += ["authorization", "content-type", "x-stainless-retry-count", "x-api-key"]
        asked = ",".join(sdk + ["bad name", "x-stainless-helper-method"])
        pre = httpx.options(
            base + "/v1/messages",
            headers={
                **ok,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": asked,
            },
        )
        assert len(asked) > 200 and pre.status_code == 204
        allowed = pre.headers["access-control-allow-headers"].split(", ")
        assert allowed == sdk + ["x-stainless-helper-method"]
        pre = httpx.options(
            base + "/v1/chat/completions", headers={**evil, "Access-Control-Request-Method": "POST"}
        )
        assert pre.status_code == 403
        # Content type: JSON only
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": ctype} if ctype else {}
            r = httpx.post(
                base + "/v1/chat/completions",
                content=json.dumps(body).encode(),
                headers={**key, **headers},
            )
            assert r.status_code == 415, (ctype, r.text)
        r = post({"Content-Type": "application/json; charset=utf-8"}, content=json.dumps(body))
        assert r.status_code == 200
        # API key
        client = openai.OpenAI(base_url=base + "/v1", api_key="s3cret", max_retries=0)
        want, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 2)
        reply = client.chat.completions.create(
            model="tiny", messages=HI, max_tokens=2, temperature=0
        )
        assert reply.choices[0].message.content == want
        assert reply._request_id.startswith("req_")  # the SDK's id of a response, for logs
        ids = {httpx.get(base + "/health").headers["x-request-id"] for _ in range(2)}
        assert len(ids) == 2
        r = httpx.post(base + "/v1/messages", headers=key, json={})  # refused, still an id
        assert r.status_code == 400 and r.headers["request-id"] == r.headers["x-request-id"]
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.get(base + "/v1/models", headers=auth)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", auth
        assert httpx.get(base + "/health").status_code == 200  # liveness needs no key
        # no server paths in answers
        card = httpx.get(base + "/v1/models", headers=key).json()["data"][0]
        assert card["dflash2"]["drafter"] == "my-drafter"
        assert "/srv" not in httpx.get(base + "/v1/models", headers=key).text
        # forwarding headers are not believed
        httpx.get(base + "/v1/models", headers={**key, "X-Forwarded-For": "6.6.6.6"})
        text = httpx.get(base + "/metrics", headers=key).text
    access = [r for r in logs.records if r.name == "uvicorn.access"]
    assert access and not any("6.6.6.6" in r.getMessage() for r in access)
    assert (
        metric(text, "dflash2_requests_total", endpoint="/v1/chat/completions", status="403") == 5
    )  # 2 hosts, 2 origins, 1 preflight
    assert metric(text, "dflash2_requests_total", endpoint="/v1/models", status="401") == 3
    assert not [r for r in logs.records if r.exc_info]


def test_trusted_proxy_options():
    assert SecurityPolicy().uvicorn_options() == {"proxy_headers": False}
    opts = SecurityPolicy(trusted_proxies=("10.0.0.2",)).uvicorn_options()
    assert opts == {"proxy_headers": True, "forwarded_allow_ips": "10.0.0.2"}
    assert SecurityPolicy(trusted_proxies=("10.0.0.0/8", "::1", "*")).trusted_proxies
    for bad in ("foo", "10.0.0.0/33", "proxy.local"):  # uvicorn would match nothing
        with pytest.raises(DFlash2Error, match="--trust-proxy"):
            SecurityPolicy(trusted_proxies=(bad,))


# ------------------------------------------------------------------ Retry-After
def test_retry_after_follows_the_queue_and_recent_generations(pair):
    app = create_app(pair, model_name="tiny", max_queue=1, max_batch=1, default_max_tokens=2)
    worker = app.state.worker
    with running(app) as base, httpx.Client(timeout=60) as http:
        generations = app.state.metrics

        def ran(n):  # the worker books a generation just after its answer is sent
            wait_for(lambda: generations.generations == n, what=f"{n} generations")

        http.post(
            base + "/v1/completions", json={"prompt": "abc", "max_tokens": 300, "temperature": 0}
        )
        ran(1)
        long_s = worker.recent_seconds
        for i in range(5):
            http.post(base + "/v1/completions", json={"prompt": "a", "max_tokens": 1})
            ran(2 + i)
        assert worker.recent_seconds < long_s  # recent ones weigh most
        cm, _lines = _open_long_stream(http, base)  # 1 running
        waiting = threading.Thread(
            target=lambda: httpx.post(
                base + "/v1/completions", timeout=60, json={"prompt": "q", "max_tokens": 1}
            )
        )
        waiting.start()
        wait_for(lambda: worker.waiting == 1, what="a waiting request")
        r = httpx.post(base + "/v1/completions", json={"prompt": "q", "max_tokens": 1})
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) == max(1, math.ceil(worker.recent_seconds * 2))
        cm.__exit__(None, None, None)
        waiting.join(60)


def test_the_worker_thread_clears_its_mlx_streams_when_it_ends(monkeypatch):
    """MLX asks every thread that ran MLX work to call mx.clear_streams() at its end, or the
    process may abort at exit ("terminate called without an active exception"): the worker
    does, after its loop ends or fails."""
    import threading

    import mlx.core as mx

    from dflash2_mlx.serve.queue import _run_then_clear

    cleared = []
    real = mx.clear_streams

    def recording():
        cleared.append(threading.current_thread().name)
        real()

    monkeypatch.setattr(mx, "clear_streams", recording)

    def work(jobs):
        mx.eval(mx.ones((8, 8)) @ mx.ones((8, 8)))
        if jobs == "fail":
            raise RuntimeError("the loop failed")

    for jobs in ("ok", "fail"):
        t = threading.Thread(target=lambda j=jobs: _quiet(_run_then_clear, work, j), name=jobs)
        t.start()
        t.join()
    assert cleared == ["ok", "fail"]


def _quiet(fn, *args):
    try:
        fn(*args)
    except RuntimeError:
        pass


def test_the_null_origin_is_allowed_only_when_named():
    """file:// pages and sandboxed frames send `Origin: null`: refused unless --cors names
    null; any other word that is not an origin is still a start-up error."""
    from dflash2_mlx.serve.api_error import APIError
    from dflash2_mlx.serve.security import SecurityGate

    scope = {"method": "POST", "path": "/v1/chat/completions", "http_version": "1.1"}
    headers = {"host": "localhost:8000", "origin": "null", "content-type": "application/json"}
    with pytest.raises(APIError) as refused:
        SecurityGate(None, SecurityPolicy())._check(scope, headers)
    assert refused.value.status == 403
    named = SecurityGate(None, SecurityPolicy(cors_origins=("null",)))._check(scope, headers)
    assert named["Access-Control-Allow-Origin"] == "null"
    with pytest.raises(DFlash2Error, match="--cors 'nul'"):
        SecurityPolicy(cors_origins=("nul",))


def test_a_client_that_leaves_before_its_answer_is_noticed_at_once():
    """A request waiting for its answer (queued behind others, or in a long prefill) learns
    that its client left when the connection closes, not at a poll: an editor's abandoned
    keystroke requests must not start their prefill behind the one that matters."""
    import asyncio

    from starlette.requests import Request

    from dflash2_mlx.serve.jobs import Item, Job
    from dflash2_mlx.serve.stream import Reader

    async def scenario():
        gone = asyncio.Event()

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        job = Job([1, 2], GenerationParams(), [])
        reader = Reader(job, Request({"type": "http", "method": "POST", "headers": []}, receive))
        first = asyncio.ensure_future(reader.next(watch_client=True))
        await asyncio.sleep(0.02)
        assert not first.done()
        job.out.put_nowait(Item("done"))  # an answer that comes is read
        assert (await asyncio.wait_for(first, 1)).kind == "done"
        waiting = asyncio.ensure_future(reader.next(watch_client=True))
        await asyncio.sleep(0.02)
        gone.set()
        assert await asyncio.wait_for(waiting, 0.1) is None  # inside the 0.2 s poll it had
        reader.close()

    asyncio.run(scenario())


def test_a_log_reader_that_stops_reading_stalls_nothing():
    """The server's stdout and stderr are pipes nobody reads (a terminal paused with Ctrl-S,
    `| less` left unscrolled): once the pipes are full, a log line written by the event loop
    blocked it, every request hung and SIGTERM could not stop the process. Lines are written
    by a thread of their own: requests go on, and SIGTERM ends the server."""
    with _child_server("0") as (proc, base):
        with httpx.Client(timeout=10) as http:
            long = "/v1/" + "x" * 190  # an access line of ~250 bytes: 500 fill 64 KB twice
            t0 = time.perf_counter()
            for _ in range(500):
                assert http.get(base + long).status_code == 404
            # ~2 ms each; 44 when Nagle's algorithm held each response for a delayed ACK
            assert time.perf_counter() - t0 < 15
            assert http.get(base + "/health").status_code == 200
            r = http.post(base + "/v1/completions", json={"prompt": "ab", "max_tokens": 2})
            assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGTERM


def test_a_socket_bound_by_a_bare_socket_call_serves_with_tcp_nodelay():
    """run_server's socket made by socket.socket() says protocol 0, and asyncio sets
    TCP_NODELAY only on connections whose socket says TCP: taken over as one that does."""
    from dflash2_mlx.serve.lifecycle import _said_tcp

    bare = socket.socket()
    bare.bind(("127.0.0.1", 0))
    address = bare.getsockname()
    tcp = _said_tcp(bare)
    assert tcp.proto == socket.IPPROTO_TCP and tcp.getsockname() == address
    tcp.listen()
    with socket.create_connection(address), tcp:
        conn, _ = tcp.accept()
        with conn:
            assert conn.proto == socket.IPPROTO_TCP
    unix = socket.socket(socket.AF_UNIX)
    assert _said_tcp(unix) is unix
    unix.close()
