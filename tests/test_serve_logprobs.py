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
from dflash2_mlx.engine.events import RoundEvent
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


def test_logprobs_beside_tools_that_are_off(pair, client):
    """tool_choice "none": the tools are neither rendered nor parsed (this template cannot
    render them), so logprobs are given as without them."""
    ref = expected(pair, chat_prompt_ids(pair.tokenizer, HI), 8)
    r = client.chat.completions.create(
        model="tiny",
        messages=HI,
        max_tokens=8,
        logprobs=True,
        tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice="none",
    )
    check_chat(pair, r.choices[0].logprobs.content, ref, 0)


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
    # text_offset: where each token's text starts in the completion's text
    text, offsets = r.choices[0].text, lp.text_offset
    assert len(offsets) == len(lp.tokens) and text.startswith(lp.tokens[0])
    assert offsets == [len(pair.tokenizer.decode([t for t, _ in ref[:k]])) for k in range(len(ref))]
    streamed, streamed_offsets = [], []
    for chunk in client.completions.create(
        model="tiny", prompt=ids, max_tokens=12, logprobs=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.token_logprobs
            streamed_offsets += chunk.choices[0].logprobs.text_offset
    np.testing.assert_allclose(streamed, lp.token_logprobs, atol=1e-5)
    assert streamed_offsets == offsets


def test_completion_top_logprobs_hold_the_chosen_token(client):
    """OpenAI: "the API will always return the logprob of the sampled token, so there may be
    up to logprobs+1 elements": logprobs=0 gives the chosen token alone, and a sampled token
    outside the most likely ones is added to them."""
    kw = dict(model="tiny", prompt=[3, 9, 4, 12], max_tokens=12)
    lp = client.completions.create(**kw, logprobs=0, temperature=0).choices[0].logprobs
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]
    lp = client.completions.create(**kw, logprobs=1, temperature=5, seed=1).choices[0].logprobs
    for token, value, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert alts[token] == value and 1 <= len(alts) <= 2
    assert any(len(alts) == 2 for alts in lp.top_logprobs), "a sample off the top expected"


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


def test_tokens_past_a_stop_string_get_no_logprobs(pair, client):
    """The stop string's text is never sent, nor are its tokens' log-probabilities: the
    entries spell the content exactly (one character a token here), whole and streamed."""
    full = pair.tokenizer.decode(
        [t for t, _ in expected(pair, chat_prompt_ids(pair.tokenizer, HI), 16)]
    )
    stop = full[6:8]
    content = full[: full.index(stop)]
    kw = dict(model="tiny", messages=HI, max_tokens=16, temperature=0, logprobs=True, stop=[stop])
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == content and r.choices[0].finish_reason == "stop"
    assert "".join(e.token for e in r.choices[0].logprobs.content) == content
    streamed = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert "".join(e.token for e in streamed) == content


def test_an_empty_reply_asked_for_logprobs_has_empty_lists(pair, client):
    """A stop string the first token completes: no text, so no entries, but the lists are
    there (empty), as clients that asked index them; a completion's parallel lists too."""
    ids = chat_prompt_ids(pair.tokenizer, HI)
    first = pair.tokenizer.decode([expected(pair, ids, 1)[0][0]])
    kw = dict(model="tiny", messages=HI, max_tokens=8, temperature=0, logprobs=True, stop=[first])
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == "" and r.choices[0].logprobs.content == []
    c = client.completions.create(model="tiny", prompt=ids, max_tokens=8, logprobs=2, stop=[first])
    assert c.choices[0].text == "" and c.choices[0].logprobs.tokens == []
    assert c.choices[0].logprobs.token_logprobs == [] and c.choices[0].logprobs.text_offset == []


@pytest.mark.real_model
def test_token_bytes_of_a_byte_level_tokenizer_rebuild_the_text(tmp_path_factory):
    """SmolLM2's byte-level BPE splits characters across tokens: each entry's `bytes` are the
    token's own, so they join back into the text's UTF-8 (a decoded token would be U+FFFD)."""
    from mlx_lm.utils import load_tokenizer
    from smollm2 import any_conversion

    from dflash2_mlx.serve.logprobs import token_bytes

    tok = load_tokenizer(any_conversion(tmp_path_factory))
    text = "naïve café — 日本語 🙂 ok"
    ids = tok.encode(text, add_special_tokens=False)
    parts = [token_bytes(tok, t) for t in ids]
    assert b"".join(parts) == text.encode("utf-8")
    assert any(len(p) and not _is_utf8(p) for p in parts), "some token should split a character"


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.real_model
def test_completion_keys_of_tokens_that_split_a_character_stay_distinct(tmp_path_factory):
    """Completions' top_logprobs is a dict keyed by token text: tokens holding part of a
    character are keyed by their bytes ("bytes:\\xe6\\x97", as OpenAI writes them), so no
    alternative overwrites another (all would be "\ufffd") and the chosen token is found."""
    from mlx_lm.utils import load_tokenizer
    from smollm2 import any_conversion

    from dflash2_mlx.engine.logprobs import TokenLogprob
    from dflash2_mlx.serve.logprobs import Logprobs, token_bytes

    tok = load_tokenizer(any_conversion(tmp_path_factory))
    ids = tok.encode("日本語 🙂", add_special_tokens=False)
    partial = [t for t in ids if not _is_utf8(token_bytes(tok, t))]
    assert len(set(partial)) >= 2
    whole = tok.encode(" ok", add_special_tokens=False)[0]
    first, second = partial[0], next(t for t in partial if t != partial[0])
    lp = Logprobs(tok, "completion", frozenset())
    top = ((second, -0.5), (first, -1.0), (whole, -2.0))
    event = RoundEvent(tokens=[first], logprobs=(TokenLogprob(first, -1.0, top),))
    lp.add(event)
    out = lp.take(10)
    key = "bytes:" + "".join(f"\\x{b:02x}" for b in token_bytes(tok, first))
    assert out["tokens"] == [key] and out["token_logprobs"] == [-1.0]
    assert len(out["top_logprobs"][0]) == 3 and out["top_logprobs"][0][key] == -1.0
    assert out["top_logprobs"][0][" ok"] == -2.0
    chat = Logprobs(tok, "chat", frozenset())  # chat entries name the token the same way
    chat.add(event)
    entry = chat.take(10)["content"][0]
    assert entry["token"] == key and entry["bytes"] == list(token_bytes(tok, first))
    assert [t["token"] for t in entry["top_logprobs"]][:2] == [
        "bytes:" + "".join(f"\\x{b:02x}" for b in token_bytes(tok, t)) for t in (second, first)
    ]
