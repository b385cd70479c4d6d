"""`dflash2 serve` with requests batched together (serve/scheduler.py): a real uvicorn server on
127.0.0.1 and the official openai client. Concurrent streams (different prompts, max_tokens,
stops, a seeded sampled one, a predicted one) each return exactly what they return alone; a
client that leaves mid-batch leaves the others intact; usage and /metrics report the batch;
the prompt cache resumes a conversation whose next turn joins a running batch; shutdown cuts
every running row; --max-batch is validated."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import tiny
from test_serve import CLI, HI, make_tokenizer, metric, reference, running, slow_pair
from test_serve_lifecycle import serving, wait_for

from dflash2_mlx.api import Pair
from dflash2_mlx.engine.batch import DEFAULT_PREFILL_STEP
from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.serve import ServeLimits, create_app, scheduler
from dflash2_mlx.settings import Drafting
from dflash2_mlx.text import chat_prompt_ids


def make_pair(family: str = "llama", seed: int = 0) -> Pair:
    return Pair.from_models(
        tiny.make_target(family, seed=seed), make_tokenizer(), tiny.make_drafter(2, block_size=4)
    )


@pytest.fixture(scope="module")
def pair():
    return make_pair()


@pytest.fixture(scope="module")
def url(pair):
    app = create_app(pair, model_name="tiny", max_queue=8, max_batch=4, default_max_tokens=8)
    with running(app) as base:
        yield base


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client, spec: dict) -> dict:
    """One streaming request (`spec`: kind and arguments): its text, finish and usage."""
    kind, kw = spec["kind"], {k: v for k, v in spec.items() if k != "kind"}
    common = dict(model="tiny", stream=True, stream_options={"include_usage": True})
    if kind == "chat":
        chunks = list(client.chat.completions.create(**common, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        chunks = list(client.completions.create(**common, **kw))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    return {"text": text, "finish": finish, "usage": chunks[-1].usage}


def together(client, specs: list[dict]) -> list[dict]:
    """Run `specs` concurrently; their results in order."""
    results: list = [None] * len(specs)
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, ask(client, specs[i])))
        for i in range(len(specs))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@contextlib.contextmanager
def holding(url: str, prompt: str = "hold"):
    """A long stream that keeps the batch busy (so requests made inside the block join it);
    its client leaves when the block ends."""
    started, done = threading.Event(), threading.Event()

    def run():
        body = {"prompt": prompt, "max_tokens": 3000, "temperature": 0, "stream": True}
        with httpx.Client(timeout=120) as http:
            with http.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    started.set()
                    if done.is_set():
                        break

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert started.wait(60), "the holding request did not start"
        yield
    finally:
        done.set()
        thread.join(60)


def idle(url: str) -> str:
    """/metrics once nothing runs (a stream whose client left is noticed between rounds)."""
    wait_for(lambda: metric(httpx.get(url + "/metrics").text, "dflash2_in_flight") == 0)
    return httpx.get(url + "/metrics").text


def test_concurrent_streams_each_equal_alone(pair, url):
    client = client_for(url)
    ids = [5, 9, 14, 20, 33, 40]
    greedy, _ = reference(pair, ids, 30)
    specs = [
        {"kind": "completion", "prompt": ids, "max_tokens": 30, "temperature": 0},
        {"kind": "completion", "prompt": "xyz", "max_tokens": 12, "temperature": 0},
        {"kind": "chat", "messages": HI, "max_tokens": 25, "temperature": 0},
        {"kind": "chat", "messages": [{"role": "user", "content": "Q?"}], "max_tokens": 40},
        {"kind": "completion", "prompt": "seed", "max_tokens": 20, "temperature": 0.8, "seed": 3},
    ]
    alone = [ask(client, s) for s in specs]
    assert alone[0]["text"] == greedy  # the server alone is plain greedy decoding
    chat_text = alone[2]["text"]
    specs[2]["stop"] = [chat_text[6:8]]  # a stop string inside its answer
    specs[3]["prediction"] = {"type": "content", "content": alone[3]["text"]}
    alone[2] = ask(client, specs[2])
    assert alone[2]["text"] == chat_text[: chat_text.find(chat_text[6:8])]
    before = httpx.get(url + "/metrics").text
    with holding(url):
        batched = together(client, specs)
    for spec, a, b in zip(specs, alone, batched):
        assert (b["text"], b["finish"]) == (a["text"], a["finish"]), spec
        assert b["usage"].completion_tokens == a["usage"].completion_tokens, spec
    ext = [b["usage"].model_extra["dflash2"] for b in batched]
    assert all(e["max_batch_size"] >= 2 and e["batch_size"] > 1 for e in ext), ext
    assert max(e["max_batch_size"] for e in ext) <= 4
    assert all(e["queue_wait_ms"] >= 0 for e in ext)
    assert batched[3]["usage"].completion_tokens_details.accepted_prediction_tokens > 0
    alone_ext = alone[1]["usage"].model_extra["dflash2"]
    assert alone_ext["batch_size"] == 1 and alone_ext["max_batch_size"] == 1
    text = idle(url)
    rounds = metric(text, "dflash2_batch_rows_count")
    assert rounds > 0 and metric(text, "dflash2_batch_rows_bucket", le="1") < rounds
    assert metric(text, "dflash2_batch_rows_bucket", le="4") == rounds  # never past max_batch
    assert metric(text, "dflash2_batch_rows_sum") > rounds  # more than one row on average
    waits = metric(text, "dflash2_queue_wait_seconds_count")
    assert waits - metric(before, "dflash2_queue_wait_seconds_count") == len(specs) + 1
    assert metric(text, "dflash2_batch_size") == 0 and metric(text, "dflash2_in_flight") == 0
    card = client.models.retrieve("tiny").model_extra["dflash2"]
    assert card["max_batch"] == 4


def test_a_client_leaving_mid_batch_leaves_the_others_intact(pair, url):
    client = client_for(url)
    specs = [
        {"kind": "completion", "prompt": p, "max_tokens": n, "temperature": 0}
        for p, n in (("abc", 150), ("dd", 120), ("Hi", 90))
    ]
    alone = [ask(client, s) for s in specs]
    before = httpx.get(url + "/metrics").text
    results: list = [None] * len(specs)

    def leaver():  # reads a few chunks, then closes its connection
        with httpx.Client(timeout=60) as http:
            body = {"prompt": "bye", "max_tokens": 3000, "temperature": 0, "stream": True}
            with http.stream("POST", url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                for _ in range(12):
                    next(lines)

    threads = [threading.Thread(target=leaver)] + [
        threading.Thread(target=lambda i=i: results.__setitem__(i, ask(client, specs[i])))
        for i in range(len(specs))
    ]
    with holding(url):  # all of them in one batch with the holding stream
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for a, b in zip(alone, results):
        assert b["text"] == a["text"] and b["finish"] == a["finish"]
        assert b["usage"].model_extra["dflash2"]["max_batch_size"] >= 2
    after = idle(url)
    # the one that left mid-batch, then the holding stream
    assert metric(after, "dflash2_cancelled_total") == metric(before, "dflash2_cancelled_total") + 2
    again = ask(client, specs[1])  # still serving, still exact
    assert again["text"] == alone[1]["text"]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_prompt_cache_resumes_a_turn_that_joins_a_batch(family):
    pair = make_pair(family, seed=2)  # its answers to "zz" and "yy" run 300+ tokens
    app = create_app(pair, model_name="tiny", max_batch=4, default_max_tokens=10)
    with running(app) as base:
        client = client_for(base)
        turn1 = {"kind": "chat", "messages": HI, "max_tokens": 10, "temperature": 0}
        with holding(base, "zz"):
            first = ask(client, turn1)
        messages = HI + [
            {"role": "assistant", "content": first["text"]},
            {"role": "user", "content": "Why?"},
        ]
        want, n = reference(pair, chat_prompt_ids(pair.tokenizer, messages), 10)
        assert n == 10  # an answer long enough to run rounds in the batch
        turn2 = {"kind": "chat", "messages": messages, "max_tokens": 10, "temperature": 0}
        with holding(base, "yy"):
            second = ask(client, turn2)
        assert second["text"] == want
        usage = second["usage"]
        cached = usage.prompt_tokens_details.cached_tokens
        # at least turn one's prompt but its last token (where a hybrid's state is kept)
        assert len(chat_prompt_ids(pair.tokenizer, HI)) - 1 <= cached < usage.prompt_tokens
        assert usage.model_extra["dflash2"]["max_batch_size"] == 2


def test_shutdown_cuts_every_running_row(pair):
    """After the grace period every running stream ends with an error event and [DONE]."""
    app = create_app(pair, model_name="tiny", max_batch=3, limits=ServeLimits(shutdown_grace_s=0.5))
    ends: list = [None] * 3

    def stream(i):
        prompt = ("zz", "yy", "dd")[i]  # no end of turn in 3000 tokens
        body = {"prompt": prompt, "max_tokens": 3000, "temperature": 0, "stream": True}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", base + "/v1/completions", json=body) as r:
                ends[i] = [line for line in r.iter_lines() if line.startswith("data: ")][-2:]

    with serving(app) as (base, server, thread):
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        wait_for(lambda: app.state.metrics.batch_size == 3, what="three rows in a round")
        server.should_exit = True
        for t in threads:
            t.join(30)
        thread.join(30)
    for end in ends:
        assert end is not None and end[-1] == "data: [DONE]"
        assert '"code": "shutting_down"' in end[0], end


def test_max_batch_is_validated(pair):
    for bad in (0, -1, 2.5, True):
        with pytest.raises(DFlash2Error, match="max_batch must be an int >= 1"):
            create_app(pair, model_name="tiny", max_batch=bad)
    # the other counts too: 2.5 or True were taken, then every request was a 500
    for field, bad in [
        ("max_queue", 2.5),
        ("default_max_tokens", True),
        ("prompt_cache_mb", True),
        ("context_length", 4096.0),
    ]:
        with pytest.raises(DFlash2Error, match=rf"{field} must be an int >= \d.*; got {bad}"):
            create_app(pair, model_name="tiny", **{field: bad})
    for bad in (1, "no"):  # refused when the app is built, not as a 500 on every request
        with pytest.raises(DFlash2Error, match="speculative must be True or False"):
            create_app(pair, model_name="tiny", drafting=Drafting(bad))
    bad = subprocess.run(
        [sys.executable, "-c", CLI, "serve", "--max-batch", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--max-batch" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_queue_places_are_running_rows_plus_waiting(pair):
    """max_batch=2, max_queue=1: two generate, one waits, the next gets 503 with a Retry-After
    of the requests ahead over the batch (recent generation time x 3 / 2)."""
    app = create_app(pair, model_name="tiny", max_queue=1, max_batch=2, default_max_tokens=2)
    worker = app.state.worker
    with running(app) as base:
        with holding(base, "zz"), holding(base, "yy"):
            wait_for(lambda: worker.running == 2, what="two rows")
            waiting = threading.Thread(
                target=lambda: httpx.post(
                    base + "/v1/completions", timeout=60, json={"prompt": "q", "max_tokens": 1}
                )
            )
            waiting.start()
            wait_for(lambda: worker.waiting == 1, what="a waiting request")
            worker.recent_seconds = 4.0  # as if recent generations took 4 s
            r = httpx.post(base + "/v1/completions", json={"prompt": "q", "max_tokens": 1})
            assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
            assert int(r.headers["retry-after"]) == math.ceil(4.0 * 1.5)
        waiting.join(60)
        r = httpx.post(base + "/v1/completions", json={"prompt": "q", "max_tokens": 1})
        assert r.status_code == 200


def test_a_client_hears_the_end_after_its_place_is_free(pair, monkeypatch):
    """max_batch=1, max_queue=0: a client that sends its next request as soon as it has the
    answer is never refused — the place is free (and the turn cached) before "done" (or an
    error) is sent; it used to be freed after, and a sequential client got 503s."""
    from dflash2_mlx.serve import jobs

    app = create_app(pair, model_name="tiny", max_queue=0, max_batch=1, default_max_tokens=3)
    worker, heard = app.state.worker, []
    real = jobs.Job.emit

    def emit(self, item):
        if item.kind in ("done", "error"):
            heard.append((item.kind, worker.running, worker.waiting))
        real(self, item)

    monkeypatch.setattr(jobs.Job, "emit", emit)
    with running(app) as base:
        for i in range(6):
            body = {"prompt": f"q{i}", "max_tokens": 3, "temperature": 0, "stream": i % 2 == 1}
            assert httpx.post(base + "/v1/completions", json=body, timeout=60).status_code == 200
    assert heard == [("done", 0, 0)] * 6


def test_retry_after_before_any_generation_finished():
    """No generation has finished yet: Retry-After is the longest running one's time so far
    (times the requests ahead over the batch), not a flat second. Each forward takes 10 ms:
    the 3,000-token stream outlasts the 2.5 s wait on any machine (6 s here at full speed)."""
    app = create_app(
        slow_pair(0.01), model_name="tiny", max_queue=0, max_batch=1, default_max_tokens=2
    )
    worker = app.state.worker
    with running(app) as base:
        with holding(base, "zz"):
            time.sleep(2.5)
            assert worker.recent_seconds is None
            r = httpx.post(base + "/v1/completions", json={"prompt": "q", "max_tokens": 1})
            assert r.status_code == 503, r.text
            assert int(r.headers["retry-after"]) >= 3


def test_retry_after_counts_a_second_at_least_per_request_ahead(pair):
    """Before any generation finished, each request ahead counts at least a second: one just
    started (its time so far ~0) must not make a long queue's Retry-After 1 s."""
    app = create_app(pair, model_name="tiny", max_queue=8, max_batch=1, default_max_tokens=2)
    worker = app.state.worker
    with running(app) as base:
        with holding(base, "zz"):
            worker.reserve(8)  # eight places taken besides the running one
            try:
                r = httpx.post(base + "/v1/completions", json={"prompt": "q", "max_tokens": 1})
            finally:
                worker.unreserve(8)
            assert r.status_code == 503 and worker.recent_seconds is None, r.text
            assert int(r.headers["retry-after"]) >= 9  # (8 waiting + 1 running) / 1 x >= 1 s


def test_a_failing_request_leaves_the_batch_alone(pair, url, monkeypatch, caplog):
    """A fault in one request's text handling answers it 500 (one traceback in the log) and
    leaves the others in the batch exact; the worker keeps serving."""
    real = scheduler.EventText.chunk
    marked = pair.tokenizer.encode("x!")

    def chunk(self, ev):  # the request whose prompt is "x!" fails at its first round
        if not ev.prefill and self.stream.decoder.ids[: len(marked)] == marked:
            raise RuntimeError("boom")
        return real(self, ev)

    monkeypatch.setattr(scheduler.EventText, "chunk", chunk)
    client = client_for(url)
    spec = {"kind": "completion", "prompt": "dd", "max_tokens": 40, "temperature": 0}
    alone = ask(client, spec)
    results: list = [None, None]

    def bad():
        body = {"prompt": "x!", "max_tokens": 40, "temperature": 0}
        results[1] = httpx.post(url + "/v1/completions", json=body, timeout=60)

    with holding(url):
        threads = [
            threading.Thread(target=lambda: results.__setitem__(0, ask(client, spec))),
            threading.Thread(target=bad),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert results[0]["text"] == alone["text"]
    assert results[0]["usage"].model_extra["dflash2"]["max_batch_size"] >= 2
    assert results[1].status_code == 500
    assert results[1].json()["error"]["code"] == "internal_error"
    assert len([r for r in caplog.records if r.exc_info]) == 1
    assert ask(client, spec)["text"] == alone["text"]


def test_a_long_prompt_does_not_stall_a_running_stream():
    """A long prompt arriving while a stream runs is prefilled between its rounds (chunks of
    8 tokens here, engine/batch.py DEFAULT_PREFILL_STEP per round): the running stream keeps
    receiving chunks until the long request's first token; both answers are what they are
    alone."""
    drafter = tiny.make_drafter(2, block_size=4)
    pair = Pair.from_models(tiny.make_target("llama"), make_tokenizer(), drafter, prefill_chunk=8)
    app = create_app(pair, model_name="tiny", max_batch=4, prompt_cache_mb=0)
    running_spec = {"prompt": "hold", "max_tokens": 600, "temperature": 0}
    long_spec = {"prompt": "The quick brown fox jumps over the lazy dog. " * 30, "max_tokens": 12}
    with running(app) as base:
        client = client_for(base)
        alone = [ask(client, {"kind": "completion", **s}) for s in (running_spec, long_spec)]
        assert alone[0]["usage"].completion_tokens == 600  # it runs all through the prefill
        arrivals, got = [], {}
        flowing = threading.Event()

        def stream(name, spec, on_chunk=None):
            chunks = client.completions.create(model="tiny", stream=True, **spec)
            text = []
            for c in chunks:
                if c.choices and c.choices[0].text:
                    text.append(c.choices[0].text)
                    if on_chunk is not None:
                        on_chunk(time.perf_counter())
            got[name] = "".join(text)

        def seen(t):
            arrivals.append(t)
            if len(arrivals) == 3:
                flowing.set()

        first = threading.Thread(target=stream, args=("running", running_spec, seen))
        first.start()
        assert flowing.wait(60), "the running stream produced nothing"
        marks = []
        sent = time.perf_counter()
        stream("long", long_spec, marks.append)
        first.join(120)
    during = [t for t in arrivals if sent < t < marks[0]]
    prompt_tokens = alone[1]["usage"].prompt_tokens
    steps = -(-prompt_tokens // DEFAULT_PREFILL_STEP)
    assert steps >= 10
    # a round per prefill step ran while it prefilled (one or two when a prefill stalls)
    assert len(during) >= steps // 2, (len(during), steps)
    assert [got["running"], got["long"]] == [a["text"] for a in alone]
