"""`n` > 1: several choices of one request, each the generation it would be alone — choice i
is the single request with seed + i (sampled) or the same greedy reply — whole and streamed
(chunks interleaved, each with its index), with the prompt counted once in `usage`."""

from __future__ import annotations

import pytest
from test_serve import HI, pair, running  # noqa: F401  (pair: fixture)

from dflash2_mlx.serve import create_app


@pytest.fixture(scope="module")
def client(pair):  # noqa: F811
    import openai

    app = create_app(pair, model_name="tiny", default_max_tokens=12, max_batch=4)
    with running(app) as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_choices_are_the_single_requests(client):
    kw = dict(model="tiny", messages=HI, max_tokens=10, temperature=1.5)
    alone = [client.chat.completions.create(seed=5 + i, **kw) for i in range(3)]
    many = client.chat.completions.create(seed=5, n=3, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.message.content for c in many.choices] == [
        a.choices[0].message.content for a in alone
    ]
    assert len({c.message.content for c in many.choices}) > 1  # sampled: they differ
    assert many.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    greedy = client.chat.completions.create(model="tiny", messages=HI, max_tokens=10, n=2)
    one = client.chat.completions.create(model="tiny", messages=HI, max_tokens=10)
    assert [c.message.content for c in greedy.choices] == [one.choices[0].message.content] * 2


def test_streamed_choices_carry_their_index(client):
    kw = dict(model="tiny", messages=HI, max_tokens=10, temperature=1.5, seed=7, n=3)
    whole = client.chat.completions.create(**kw)
    texts, finishes, usage = {}, {}, []
    for chunk in client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kw
    ):
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert len(usage) == 1 and usage[0].completion_tokens == whole.usage.completion_tokens
    # a choice after the first waits for its first token before any keep-alive (5 s here)
    raw = client.chat.completions.with_raw_response.create(stream=True, **kw)
    lines = [line for line in raw.http_response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and not any(line.startswith(":") for line in lines)


def test_completion_choices(client):
    kw = dict(model="tiny", prompt="abc", max_tokens=8, temperature=1.5)
    many = client.completions.create(seed=3, n=2, **kw)
    alone = [client.completions.create(seed=3 + i, **kw).choices[0].text for i in range(2)]
    assert [c.text for c in many.choices] == alone and [c.index for c in many.choices] == [0, 1]
    streamed = {}
    for chunk in client.completions.create(seed=3, n=2, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {0: alone[0], 1: alone[1]}


def test_a_batch_of_prompts_is_each_prompt_alone(client):
    """`prompt` as a list (LangChain's OpenAI LLM, eval harnesses): prompt k's choice j is at
    index k * n + j and is that prompt's request alone; each prompt counts once in usage."""
    prompts = ["abc", "hello there", [5, 6, 7]]
    kw = dict(model="tiny", max_tokens=8, temperature=1.5, seed=3)
    alone = [client.completions.create(prompt=p, n=2, **kw) for p in prompts]
    batch = client.completions.create(prompt=prompts, n=2, **kw)
    assert [c.index for c in batch.choices] == list(range(6))
    assert [c.text for c in batch.choices] == [c.text for a in alone for c in a.choices]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    streamed = {}
    for chunk in client.completions.create(prompt=prompts, n=2, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in batch.choices}
    greedy = client.completions.create(model="tiny", prompt=prompts[:2], max_tokens=8)
    one = client.completions.create(model="tiny", prompt=prompts[1], max_tokens=8)
    assert greedy.choices[1].text == one.choices[0].text


def test_more_choices_than_the_server_takes_is_a_400(pair):  # noqa: F811
    import httpx

    app = create_app(pair, model_name="tiny", default_max_tokens=4, max_batch=1, max_queue=1)
    with running(app) as base:
        body = {"messages": HI, "n": 3, "max_tokens": 2}
        r = httpx.post(base + "/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        ok = httpx.post(base + "/v1/chat/completions", json={**body, "n": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
        three = {"prompt": ["a", "b", "c"], "max_tokens": 2}
        r = httpx.post(base + "/v1/completions", json=three)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        long = {"prompt": ["a", "b" * 5000], "max_tokens": 2}  # the second is past the context
        r = httpx.post(base + "/v1/completions", json=long)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt[1]", r.text
        assert "\ndflash2_queue_depth 0" in httpx.get(base + "/metrics").text  # none leaked
