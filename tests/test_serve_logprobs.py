"""Token log-probabilities through the server, with the official `openai` client on a real
uvicorn server on 127.0.0.1: chat (`logprobs`, `top_logprobs`) and completions (`logprobs`),
whole and streamed, are the numbers mlx-lm's plain decoding gives for the same tokens; the
stop token gets none; bad values are a 400 naming the field."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
import tiny
from test_logprobs import mlx_lm_logprobs
from test_serve import EOS, HI, make_tokenizer, running

from dflash2_mlx.api import Pair
from dflash2_mlx.serve import create_app
from dflash2_mlx.text import chat_prompt_ids


@pytest.fixture(scope="module")
def pair():
    model = tiny.make_target("llama")
    return Pair.from_models(model, make_tokenizer(), tiny.make_drafter(2, block_size=4))


@pytest.fixture(scope="module")
def url(pair):
    with running(create_app(pair, model_name="tiny", default_max_tokens=16)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def expected(pair, ids, n):
    """mlx-lm's greedy tokens (the stop token dropped) and their log-probability rows."""
    ref = mlx_lm_logprobs(pair.model, ids, n)
    cut = next((i for i, (t, _) in enumerate(ref) if t == EOS), len(ref))
    return ref[:cut]


def check_chat(pair, content, ref, top):
    assert [e.token for e in content] == [pair.tokenizer.decode([t]) for t, _ in ref]
    for e, (tok, row) in zip(content, ref):
        assert abs(e.logprob - row[tok]) < 1e-3
        assert e.bytes == list(e.token.encode("utf-8"))
        assert len(e.top_logprobs) == top
        np.testing.assert_allclose(
            [a.logprob for a in e.top_logprobs], np.sort(row)[::-1][:top], atol=1e-3
        )


def test_chat_logprobs_whole_and_streamed(pair, client):
    ref = expected(pair, chat_prompt_ids(pair.tokenizer, HI), 16)
    kw = dict(model="tiny", messages=HI, max_tokens=16, temperature=0, logprobs=True)
    r = client.chat.completions.create(**kw, top_logprobs=3)
    assert r.choices[0].message.content == pair.tokenizer.decode([t for t, _ in ref])
    check_chat(pair, r.choices[0].logprobs.content, ref, 3)
    content = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            content += chunk.choices[0].logprobs.content
    check_chat(pair, content, ref, 0)
    plain = client.chat.completions.create(model="tiny", messages=HI, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_whole_and_streamed(pair, client):
    ids = [3, 9, 4, 12]
    ref = expected(pair, ids, 12)
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=12, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == [pair.tokenizer.decode([t]) for t, _ in ref]
    np.testing.assert_allclose(lp.token_logprobs, [row[t] for t, row in ref], atol=1e-3)
    for alts, (_, row) in zip(lp.top_logprobs, ref):
        np.testing.assert_allclose(
            sorted(alts.values(), reverse=True), np.sort(row)[::-1][:2], atol=1e-3
        )
    streamed = []
    for chunk in client.completions.create(
        model="tiny", prompt=ids, max_tokens=12, logprobs=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.token_logprobs
    np.testing.assert_allclose(streamed, lp.token_logprobs, atol=1e-5)


@pytest.mark.parametrize(
    "endpoint,body,param",
    [
        ("chat", {"messages": HI, "logprobs": 1}, "logprobs"),
        ("chat", {"messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"messages": HI, "top_logprobs": 2}, "top_logprobs"),
        ("completions", {"prompt": "ab", "logprobs": 6}, "logprobs"),
        ("completions", {"prompt": "ab", "logprobs": True}, "logprobs"),
    ],
)
def test_bad_logprobs_are_a_400_naming_the_field(url, endpoint, body, param):
    path = "chat/completions" if endpoint == "chat" else "completions"
    r = httpx.post(f"{url}/v1/{path}", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
