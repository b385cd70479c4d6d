"""`dflash2 serve` against careless and hostile input, on a real uvicorn server on 127.0.0.1:
bodies bounded while they are read (memory back to baseline), lengths checked before heavy
work, hostile JSON a clean 400, every client error a counted JSON 4xx without a traceback,
underflowing sampling parameters greedy, and the text exactly the tokenizer's decode."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import time

import httpx
import openai
import pytest
import tiny
from test_serve import HI, TEMPLATE, make_tokenizer, metric, reference, running

from dflash2_mlx.api import Pair
from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.serve import ServeLimits, create_app
from dflash2_mlx.text import chat_prompt_ids

MB = 1024 * 1024
BODY_LIMIT = 1 * MB
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def pair():
    return Pair.from_models(
        tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2, block_size=4)
    )


@pytest.fixture
def logs(caplog):
    """caplog, also hearing uvicorn (whose loggers do not propagate to the root)."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="dflash2")  # a server made earlier may have raised it
    uv = logging.getLogger("uvicorn")
    uv.addHandler(caplog.handler)
    yield caplog
    uv.removeHandler(caplog.handler)


@pytest.fixture(scope="module")
def url(pair):
    app = create_app(
        pair,
        model_name="tiny",
        max_queue=4,
        default_max_tokens=8,
        limits=ServeLimits(max_body_bytes=BODY_LIMIT, max_prediction_tokens=64, max_stop_chars=50),
    )
    with running(app) as base:
        yield base


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), from `ps` (Linux and macOS)."""
    out = subprocess.run(
        ["ps", "-o", "rss=", "-p", str(pid or os.getpid())],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.strip()) / 1024


def raw_post(base: str, path: str, head: dict, chunks, read_early: bool = True) -> tuple[int, dict]:
    """POST over a plain socket, sending `chunks` (bytes) one by one until the server answers
    (or the connection breaks); returns (status, JSON body)."""
    import select

    port = int(base.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        "Connection: close",
    ]
    lines += [f"{k}: {v}" for k, v in head.items()]
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    try:
        for chunk in chunks:
            if read_early and select.select([s], [], [], 0)[0]:
                break  # the server has answered: stop sending
            s.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    data = b""
    try:
        while part := s.recv(65536):
            data += part
    except ConnectionResetError:
        pass
    s.close()
    head_text, _, body = data.partition(b"\r\n\r\n")
    status = int(head_text.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head_text.lower():
        body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    return status, json.loads(body)


def chunked(total: int, piece: int = 64 * 1024):
    """A chat body of about `total` bytes in HTTP chunked encoding (no Content-Length)."""
    start = b'{"messages": [{"role": "user", "content": "'
    yield b"%x\r\n%s\r\n" % (len(start), start)
    sent = len(start)
    block = b"x" * piece
    while sent < total:
        yield b"%x\r\n%s\r\n" % (piece, block)
        sent += piece
    end = b'"}]}'
    yield b"%x\r\n%s\r\n0\r\n\r\n" % (len(end), end)


# ------------------------------------------------------------------ bodies and memory
def test_large_bodies_are_refused_while_read_and_memory_returns(url):
    """A declared 50 MB body is refused before it is read; a streamed one as soon as it
    passes the limit; bodies within the limit but over the length limits are refused before
    tokenizing. Memory returns to its baseline."""
    huge_prompt = {"prompt": "x" * (BODY_LIMIT - 1000)}  # within the body limit
    for _ in range(2):  # warm up every path once
        raw_post(url, CHAT, {"Content-Length": str(50 * MB)}, [])
        httpx.post(url + "/v1/completions", json=huge_prompt, timeout=30)
    base = rss_mb()
    t0 = time.time()
    status, body = raw_post(url, CHAT, {"Content-Length": str(50 * MB)}, [])
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert time.time() - t0 < 5
    for _ in range(3):
        status, body = raw_post(url, CHAT, {"Transfer-Encoding": "chunked"}, chunked(20 * MB))
        assert status == 413, body
    for _ in range(3):
        t0 = time.time()
        r = httpx.post(url + "/v1/completions", json=huge_prompt, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert time.time() - t0 < 5  # refused on its length in characters, not tokenized
        r = httpx.post(
            url + CHAT,
            json={
                "messages": HI,
                "prediction": {"type": "content", "content": "y" * (BODY_LIMIT - 1000)},
            },
            timeout=30,
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "prediction", r.text
    grown = rss_mb() - base
    assert grown < 80, f"resident memory grew by {grown:.0f} MB"
    text = httpx.get(url + "/metrics").text
    assert metric(text, "dflash2_requests_total", endpoint=CHAT, status="413") >= 5


def test_every_string_a_template_may_render_counts_before_tokenizing(url):
    """A message's name, a call's arguments, a tool's description: long text anywhere in the
    messages or tools is refused on its characters, before the template or the tokenizer runs
    (it once took seconds to tokenize while holding the queue)."""
    long = "x" * (BODY_LIMIT - 2000)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": long}}
    tool = {"type": "function", "function": {"name": "f", "description": long, "parameters": {}}}
    for body in (
        {"messages": [{"role": "user", "content": "hi", "name": long}]},
        {"messages": HI + [{"role": "assistant", "content": "", "tool_calls": [call]}]},
        {"messages": HI, "tools": [tool]},
    ):
        r = httpx.post(url + CHAT, json=body, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
        assert "characters" in error["message"], error  # counted, not tokenized


def test_lengths_in_tokens_and_stop_strings(url, pair):
    r = httpx.post(url + "/v1/completions", json={"prompt": list(range(5, 80)) * 60})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(
        url + CHAT, json={"messages": HI, "prediction": {"type": "content", "content": "ab" * 40}}
    )  # 80 tokens > 64
    assert r.status_code == 400 and r.json()["error"]["param"] == "prediction", r.text
    assert "80 tokens" in r.json()["error"]["message"]
    r = httpx.post(url + CHAT, json={"messages": HI, "stop": ["a", "s" * 51]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop[1]", r.text
    ok = httpx.post(
        url + CHAT,
        json={
            "messages": HI,
            "stop": "s" * 50,
            "temperature": 0,
            "prediction": {"type": "content", "content": "ab" * 30},
        },
    )
    assert ok.status_code == 200, ok.text


def test_error_messages_quote_a_short_prefix(url):
    big = "v" * 100_000
    for body in (
        {"messages": HI, "model": big},
        {"messages": HI, "temperature": big},
        {"messages": HI, big: 1},
        {"messages": [{"role": big, "content": "x"}]},
        {"messages": HI, "n": [big[:500]] * 100},
    ):
        r = httpx.post(url + CHAT, json=body)
        assert r.status_code in (400, 404), r.text
        assert len(r.content) < 1200, (r.status_code, len(r.content))


# ------------------------------------------------------------------ hostile JSON
def test_hostile_json_is_a_counted_400_without_traceback(url, logs):
    before = httpx.get(url + "/metrics").text
    deep = '{"messages": ' + "[" * 10_000 + "]" * 10_000 + "}"
    cases = [
        (CHAT, deep.encode(), None),
        (CHAT, ('{"messages": ' + "[" * 100 + "]" * 100 + "}").encode(), None),
        (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
        ("/v1/completions", b'{"prompt": "\\udfff"}', "prompt"),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "prediction": '
            b'{"type": "content", "content": [{"type": "text", "text": "\\ud83d"}]}}',
            "prediction.content[0].text",
        ),
        (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "\\ud800": 1}', None),
        (CHAT, b'{"messages": "\xff\xfe"}', None),
        (CHAT, b'{"max_tokens": ' + b"9" * 5000 + b"}", None),  # past Python's int digits
    ]
    with httpx.Client(timeout=30) as http:  # one keep-alive connection for all of them
        for path, raw, param in cases:
            r = http.post(url + path, content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, (raw[:60], r.text)
            err = r.json()["error"]
            assert err["param"] == param, (raw[:60], err)
            assert "sys." not in err["message"], err  # no advice for Python programmers
        r = http.post(url + CHAT, json={"messages": HI, "max_tokens": 2})
        assert r.status_code == 200  # the same connection still serves
    after = httpx.get(url + "/metrics").text
    assert (
        metric(after, "dflash2_requests_total", endpoint=CHAT, status="400")
        - metric(before, "dflash2_requests_total", endpoint=CHAT, status="400")
    ) == 7
    assert not [r for r in logs.records if r.exc_info], "a client error logged a traceback"


def test_a_compressed_body_is_a_415_naming_its_encoding(url):
    import gzip

    raw = gzip.compress(json.dumps({"messages": HI, "max_tokens": 2}).encode())
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    r = httpx.post(url + CHAT, content=raw, headers=headers)
    assert r.status_code == 415, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_content_encoding" and "'gzip'" in err["message"], err
    headers["content-encoding"] = "identity"  # the one encoding a body may declare
    r = httpx.post(url + CHAT, json={"messages": HI, "max_tokens": 2}, headers=headers)
    assert r.status_code == 200, r.text


def test_client_closing_mid_upload_is_one_line_and_counted(url, logs):
    before = httpx.get(url + "/metrics").text
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
            'application/json\r\nContent-Length: 5000\r\n\r\n{"messages": ['.encode()
        )
        time.sleep(0.3)
    deadline = time.time() + 10
    while time.time() < deadline:
        after = httpx.get(url + "/metrics").text
        if metric(after, "dflash2_requests_total", endpoint=CHAT, status="499") > metric(
            before, "dflash2_requests_total", endpoint=CHAT, status="499"
        ):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the abandoned upload was not counted")
    gone = [r for r in logs.records if "closed the connection" in r.getMessage()]
    assert len(gone) == 1
    assert not [r for r in logs.records if r.exc_info], "an abandoned upload logged a traceback"


def test_what_a_client_sends_cannot_forge_a_log_line(url, logs):
    """A %0a in a path, a newline in a field name, a terminal escape: each logged escaped,
    on the one line of its refusal."""
    port = url.rsplit(":", 1)[1]
    forged = "%0aINFO:%20FORGED%1b[31m"
    assert httpx.get(url + "/nowhere" + forged).status_code == 404
    r = httpx.get(url + "/v1/models" + forged, headers={"Host": f"evil.example:{port}"})
    assert r.status_code == 403
    r = httpx.post(url + CHAT, json={"messages": HI, "x\nINFO: FORGED\x1b[31m": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x\nINFO: FORGED\x1b[31m"
    ours = [r.getMessage() for r in logs.records if r.name.startswith("dflash2")]
    lines = [line for line in ours if "FORGED" in line]
    assert len(lines) == 3, lines
    for line in lines:
        assert "\n" not in line and "\x1b" not in line, line
        assert "FORGED\\x1b[31m" in line, line


# ------------------------------------------------------------------ sampling underflow
def test_underflowing_temperature_and_top_p_are_greedy(pair, url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    want, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 8)
    for kw in (
        {"temperature": 1e-39},
        {"temperature": 5e-324},
        {"temperature": 1.0, "top_p": 1e-46, "seed": 3},
    ):
        r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, **kw)
        assert r.choices[0].message.content == want, kw


# ------------------------------------------------------------------ exact text
def bpe_pair():
    """A tiny target behind a real byte-level BPE tokenizer (trained here, GPT-2 style: most
    tokens carry their leading space), wrapped as mlx-lm wraps such tokenizers (its BPE
    streaming detokenizer trims the first token's space)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = (
        "the capital of France is Paris and the river Seine runs through it while "
        "people walk over bridges at night, looking at lights; numbers 12 345 6789 "
        "and code like def f(x): return x * 2 appear too"
    ).split()
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        show_progress=False,
        special_tokens=["<unk>", "<|im_start|>", "<|im_end|>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<mask>"],
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = TEMPLATE
    vocab = len(hf)
    wrapped = TokenizerWrapper(hf, detokenizer_class=BPEStreamingDetokenizer)
    target = tiny.make_target("llama", vocab=vocab, seed=5)
    drafter = tiny.make_drafter(
        2, block_size=4, vocab=vocab, mask_token_id=hf.convert_tokens_to_ids("<mask>")
    )
    return Pair.from_models(target, wrapped, drafter), hf, corpus


def test_text_is_exactly_the_decode_of_the_generated_ids():
    """Completions and chat, whole and streamed: the text equals the tokenizer's decode of
    the generated ids (plain greedy decoding's), leading spaces included."""
    pair, hf, corpus = bpe_pair()
    eos = hf.eos_token_id

    def want(prompt_ids):
        ids = tiny.greedy_reference(pair.model, prompt_ids, 10, eos={eos})
        return hf.decode([t for t in ids if t != eos])

    spaced, unspaced = [], []  # answers that start with a space, and others
    for line in corpus:
        for n in (2, 3, 5):
            prompt = " ".join(line.split()[:n])
            text = want(hf.encode(prompt))
            (spaced if text.startswith(" ") else unspaced).append((prompt, text))
        if len(spaced) >= 6 and len(unspaced) >= 3:
            break
    assert len(spaced) >= 4  # the case that was broken (" Paris" -> "Paris") is exercised
    cases = spaced[:6] + unspaced[:3]
    app = create_app(pair, model_name="bpe", default_max_tokens=10)
    with running(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)
        for i, (prompt, text) in enumerate(cases):
            kw = dict(model="bpe", max_tokens=10, temperature=0)
            got = client.completions.create(prompt=prompt, **kw).choices[0].text
            streamed = "".join(
                c.choices[0].text
                for c in client.completions.create(prompt=prompt, stream=True, **kw)
            )
            assert got == streamed == text, (prompt, got, streamed, text)
            if i % 3 == 0:
                msgs = [{"role": "user", "content": prompt}]
                text = want(chat_prompt_ids(pair.tokenizer, msgs))
                got = client.chat.completions.create(messages=msgs, **kw).choices[0].message.content
                streamed = "".join(
                    c.choices[0].delta.content or ""
                    for c in client.chat.completions.create(messages=msgs, stream=True, **kw)
                    if c.choices
                )
                assert got == streamed == text, (prompt, got, streamed, text)


def test_a_server_fault_is_a_counted_json_500_and_the_server_keeps_serving(logs):
    """A fault inside generation (injected into this pair's own target adapter instance) is a
    JSON 500 without a traceback or a path in the body, counted in /metrics, logged; the next
    request is served normally."""
    faulty = Pair.from_models(
        tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2, block_size=4)
    )
    target = faulty.decoder.target
    real_forward, broken = target.forward, {"on": True}

    def forward(*args, **kwargs):
        if broken["on"]:
            raise RuntimeError("injected fault in /secret/path/model.py")
        return real_forward(*args, **kwargs)

    target.forward = forward  # this adapter instance only
    app = create_app(faulty, model_name="tiny", default_max_tokens=8)
    body = {"messages": HI, "max_tokens": 6, "temperature": 0}
    with running(app) as base:
        r = httpx.post(base + CHAT, json=body, timeout=60)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "server_error" and "/secret/path" not in err["message"]
        assert "Traceback" not in r.text
        broken["on"] = False
        ok = httpx.post(base + CHAT, json=body, timeout=60)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None
        text = httpx.get(base + "/metrics", timeout=10).text
    assert metric(text, "dflash2_requests_total", endpoint=CHAT, status="500") == 1
    assert metric(text, "dflash2_requests_total", endpoint=CHAT, status="200") == 1
    assert any("injected fault" in rec.getMessage() or rec.exc_info for rec in logs.records)


def test_descriptor_exhaustion_is_bounded_and_logged_once_a_minute(monkeypatch):
    """A flood of idle connections (a review's 2,100 half-sent headers) took every file
    descriptor, /health with them, and asyncio logged each failed accept with a traceback
    (60 MB in 17 s): uvicorn now holds at most MAX_CONNECTIONS, the soft descriptor limit is
    raised toward the hard one, and the accept error is logged once a minute."""
    resource = pytest.importorskip("resource")
    from dflash2_mlx.serve import lifecycle

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, hard))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    lifecycle._more_files()
    top = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    assert calls == ([(top, hard)] if top > 256 else [])

    def macos(_, limits):  # refuses past kern.maxfilesperproc, its hard limit unlimited
        calls.append(limits)
        if limits[0] > 10240:
            raise ValueError("not allowed to raise maximum limit")

    calls.clear()
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", macos)
    lifecycle._more_files()  # it stayed at 256 there
    assert [soft for soft, _ in calls] == [65536, 10240]

    def record(msg, at):
        r = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)
        r.created = at
        return r

    once = lifecycle._Sometimes(60.0)
    flood = [once.filter(record("socket.accept() out of system resource", t)) for t in range(90)]
    assert flood.count(True) == 2 and flood[0] and flood[60]
    assert once.filter(record("something else", 1.0))
    pair = Pair.from_models(tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2))
    server = lifecycle.make_server(create_app(pair, model_name="t"))
    assert server.config.limit_concurrency == lifecycle.MAX_CONNECTIONS
    # asyncio's lines (a failed accept) and the library's go through the log thread too: a
    # log reader that stalls would otherwise freeze the event loop on them
    from dflash2_mlx.serve.log_output import BackgroundStream

    for name in ("asyncio", "dflash2_mlx", "dflash2", "uvicorn", "uvicorn.access"):
        streams = [getattr(h, "stream", None) for h in logging.getLogger(name).handlers]
        assert any(isinstance(st, BackgroundStream) for st in streams), (name, streams)


def test_a_stalled_body_is_a_408_and_its_buffer_freed():
    """A body that stops coming (a review held 300 of them, 4 MB each, with no key) is
    refused once nothing of it arrived for body_stall_s: the connection and its buffer go."""
    pair = Pair.from_models(tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2))
    app = create_app(pair, model_name="t", limits=ServeLimits(body_stall_s=0.5))
    with running(app) as base:
        t0 = time.monotonic()
        status, body = raw_post(base, "/v1/chat/completions", {"Content-Length": "100"}, [b'{"m'])
        assert status == 408 and body["error"]["code"] == "request_timeout", body
        assert time.monotonic() - t0 < 10
        ok = httpx.post(base + "/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
        assert ok.status_code == 200
    with pytest.raises(DFlash2Error, match="body_stall_s must be > 0"):
        ServeLimits(body_stall_s=0)


def test_a_body_trickled_slower_than_the_least_rate_is_a_408():
    """A body that never stalls but comes a byte at a time (a review held twelve 1 MB ones
    at 1 byte/s, never cut) is refused once it has not all come body_stall_s plus its size at
    MIN_BODY_RATE after the read began: here 2 s plus 200 bytes' worth."""
    pair = Pair.from_models(tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2))
    app = create_app(pair, model_name="t", limits=ServeLimits(body_stall_s=2.0))

    whole = b'{"messages": [{"role": "user", "content": "' + b"x" * 152 + b'"}]}'

    def trickle():
        for byte in whole:
            time.sleep(0.05)  # never 2 s without a byte: no stall
            yield bytes([byte])

    with running(app) as base:
        t0 = time.monotonic()
        head = {"Content-Length": str(len(whole))}
        status, body = raw_post(base, "/v1/chat/completions", head, trickle())
        assert status == 408 and body["error"]["code"] == "request_timeout", body
        assert "came too slowly" in body["error"]["message"], body
        assert time.monotonic() - t0 < 8  # the whole body would take 10 s
        ok = httpx.post(base + "/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
        assert ok.status_code == 200


def test_a_413_reaches_a_client_that_sends_its_whole_body_before_reading():
    """Python's http.client sends a whole body before it reads: a 413 that closed its
    connection at once met it with a reset instead of the answer (a slow sender after a 413
    is cut by the next request head's deadline instead: test_serve_lifecycle)."""
    import http.client

    pair = Pair.from_models(tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2))
    app = create_app(pair, model_name="t", limits=ServeLimits(max_body_bytes=1000))
    with running(app) as base:
        conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=30)
        body = b'{"messages": "' + b"x" * 2_000_000 + b'"}'
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 413
        assert json.loads(answer.read())["error"]["code"] == "request_too_large"
        conn.close()


def test_many_consecutive_turns_are_joined_in_linear_time():
    """Consecutive turns, which Messages and Responses join into one: a join per turn copied
    the text so far each time (50,000 turns, a 4 MB body, took 10-12 s of one core). Four
    times the turns take about four times as long now, sixteen before."""
    from dflash2_mlx.serve.messages_request import parse_messages
    from dflash2_mlx.serve.responses_request import parse_responses

    text = "x" * 80
    said = {"type": "message", "role": "assistant", "content": text}
    thought = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "t"}],
    }

    def parse(n: int) -> float:
        t0 = time.process_time()  # CPU time: a busy machine's preemptions are not counted
        turns = [{"role": "user", "content": text}] * n
        req = parse_messages({"model": "m", "max_tokens": 4, "messages": turns})
        assert [m["content"] for m in req.messages] == ["\n".join([text] * n)]
        req = parse_responses({"input": [*HI, *[thought, said] * n, *HI]})
        assert req.messages[1]["content"] == text * n
        assert req.messages[1]["reasoning_content"] == "t" * n
        return time.process_time() - t0

    # the best of 3 each: a busy machine still evicts the caches of some runs
    small = min(parse(5_000) for _ in range(3))
    large = min(parse(20_000) for _ in range(3))
    assert large < 8 * small, (small, large)


def test_item_references_stand_for_no_more_than_a_body_may_hold():
    from dflash2_mlx.serve.api_error import APIError
    from dflash2_mlx.serve.response_items import RecentItems

    recent = RecentItems(max_resolved=1000)
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": "y" * 300}
    recent.add(item)
    ref = {"type": "item_reference", "id": "msg_1"}
    assert recent.resolved([ref, ref]) == [item, item]
    with pytest.raises(APIError) as refused:
        recent.resolved([ref] * 4)  # 1.2k characters of items from 4 references
    assert refused.value.status == 413 and refused.value.param == "input"


def test_a_body_that_takes_long_to_parse_leaves_the_server_answering(pair, monkeypatch):
    """Parsing runs off the event loop: a body whose parse takes seconds (a 700,000-prompt
    completions body took 12 s to refuse) held up /health, every stream and the shutdown
    signal. Here the parse waits on an event while /health is asked; then a batch that large
    is refused by its count before anything is made per prompt."""
    import threading

    from dflash2_mlx.serve import app as app_module

    release, parsing = threading.Event(), threading.Event()
    real = app_module.parse_completion

    def slow_parse(body):
        parsing.set()
        release.wait(20)
        return real(body)

    monkeypatch.setattr(app_module, "parse_completion", slow_parse)
    with running(create_app(pair, model_name="t")) as base:
        done: list = []
        post = threading.Thread(
            target=lambda: done.append(
                httpx.post(
                    base + "/v1/completions",
                    json={"prompt": ["a"] * 700_000, "max_tokens": 1},
                    timeout=120,
                )
            )
        )
        post.start()
        assert parsing.wait(60)
        t0 = time.perf_counter()
        assert httpx.get(base + "/health", timeout=30).status_code == 200
        answered = time.perf_counter() - t0
        release.set()
        post.join(60)
    assert answered < 5, answered  # not the 20 s the parse was held
    assert done[0].status_code == 400 and "choices are more" in done[0].json()["error"]["message"]


def test_the_prompt_limit_is_worded_as_the_context_limit_clients_trim_for(pair):
    """--max-prompt-tokens below the context is refused in the words agent frameworks match
    to trim their history (OpenAI's "maximum context length is N tokens", Anthropic's
    "prompt is too long"), with the server's limit as N."""
    app = create_app(pair, model_name="t", limits=ServeLimits(max_prompt_tokens=40))
    long = [{"role": "user", "content": "a b c d e f g h " * 8}]
    with running(app) as base:
        r = httpx.post(base + CHAT, json={"messages": long, "max_tokens": 2})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded", r.text
        assert err["param"] == "messages"
        # the phrase clients match (litellm: "this model's maximum context length is")
        limit = re.search(r"This model's maximum context length is (\d+) tokens", err["message"])
        assert limit and limit.group(1) == "40", err  # the pattern clients read N with
        r = httpx.post(
            base + "/v1/messages", json={"messages": long, "max_tokens": 2, "model": "t"}
        )
        assert r.status_code == 400, r.text
        assert "prompt is too long: " in r.json()["error"]["message"]
        assert r.json()["error"]["message"].endswith("> 40 maximum")
        ok = httpx.post(base + CHAT, json={"messages": HI, "max_tokens": 2})
        assert ok.status_code == 200, ok.text


def test_an_app_served_again_reads_bodies_that_come_in_pieces(pair):
    """The shutdown's stop event belongs to the loop that serves: an app served a second time
    (a new event loop) read every body that came in more than one piece as shutting down."""
    app = create_app(pair, model_name="t")

    def pieces():
        yield b'{"messages": '
        time.sleep(0.3)
        yield b'"bad"}'

    for _ in range(2):
        with running(app) as base:
            r = httpx.post(
                base + CHAT, content=pieces(), headers={"content-type": "application/json"}
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
