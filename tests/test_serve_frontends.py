"""What chat front ends send (Open WebUI, LM Studio's clients, SillyTavern's vLLM text
completions), against a real uvicorn server on 127.0.0.1: the fields they always send pass
where they change nothing, are honoured where they do, and are refused with a 400 naming them
otherwise; a web page's origin the server refuses is told the flag that allows it."""
# ruff: noqa: F811  (test_serve's fixtures, imported by name, are the tests' arguments)

from __future__ import annotations

import logging

import httpx
import pytest
from test_serve import HI, pair, url  # noqa: F401  (its fixtures)

from dflash2_mlx import GenerationParams
from dflash2_mlx.serve import create_app
from dflash2_mlx.serve.schemas import APIError
from dflash2_mlx.serve.security import SecurityGate, SecurityPolicy

IM_START = 1  # a special token of the tiny tokenizer (not its EOS)
PROMPT = [3, 9, 4, 12]


def post(url, path, body):
    return httpx.post(f"{url}/v1/{path}", json={"model": "tiny", **body}, timeout=60)


def test_sillytaverns_vllm_text_completion_fields_pass(url):
    """SillyTavern's vLLM body: its neutral values change nothing; other values are a 400."""
    plain = post(url, "completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    st = dict(
        skip_special_tokens=True,
        spaces_between_special_tokens=True,
        ignore_eos=False,
        min_tokens=0,
        include_stop_str_in_output=False,
        typical_p=1,
    )
    r = post(url, "completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, **st})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    for field, value in [
        ("ignore_eos", True),
        ("min_tokens", 4),
        ("spaces_between_special_tokens", False),
        ("typical_p", 0.9),
    ]:
        r = post(url, "completions", {"prompt": PROMPT, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = post(url, "chat/completions", {"messages": HI, "skip_special_tokens": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "skip_special_tokens"


def test_skip_special_tokens_hides_them_from_a_completions_text(url, pair):
    """A reply of special tokens (logit_bias): kept as text by default, hidden with
    skip_special_tokens (and their log-probability entries with them); usage counts them."""
    body = {"prompt": PROMPT, "max_tokens": 3, "logit_bias": {str(IM_START): 100}, "logprobs": 0}
    kept = post(url, "completions", body).json()
    assert kept["choices"][0]["text"] == "<|im_start|>" * 3
    hidden = post(url, "completions", {**body, "skip_special_tokens": True}).json()
    assert hidden["choices"][0]["text"] == "" and hidden["choices"][0]["logprobs"]["tokens"] == []
    assert hidden["usage"]["completion_tokens"] == 3
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        json={"model": "tiny", **body, "skip_special_tokens": True, "stream": True},
        timeout=60,
    ) as r:
        streamed = "".join(line for line in r.iter_lines())
    assert "im_start" not in streamed and "[DONE]" in streamed


@pytest.mark.parametrize("limit", [-1, -2])
def test_max_tokens_no_limit_is_the_same_as_leaving_it_out(url, limit):
    """LM Studio's and Ollama's -1 ("no limit") and -2 ("fill the context")."""
    for path, body in [("completions", {"prompt": PROMPT}), ("chat/completions", {"messages": HI})]:
        left_out = post(url, path, {**body, "temperature": 0}).json()
        r = post(url, path, {**body, "temperature": 0, "max_tokens": limit})
        assert r.status_code == 200, r.text
        assert r.json()["choices"] == left_out["choices"]
    r = post(url, "completions", {"prompt": PROMPT, "max_tokens": -3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_open_webuis_ollama_fields(url):
    """repeat_penalty is repetition_penalty's other name (honoured), keep_alive changes
    nothing; a disagreement between the two names is a 400 naming the alias."""
    base = {"messages": HI, "max_tokens": 10, "temperature": 0}
    named = post(url, "chat/completions", {**base, "repetition_penalty": 1.8}).json()
    alias = post(url, "chat/completions", {**base, "repeat_penalty": 1.8, "keep_alive": "5m"})
    assert alias.status_code == 200, alias.text
    assert alias.json()["choices"] == named["choices"]
    plain = post(url, "chat/completions", base).json()
    assert plain["choices"] != named["choices"]  # the penalty does change this reply
    r = post(url, "chat/completions", {**base, "repeat_penalty": 1.8, "repetition_penalty": 1.1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "repeat_penalty"
    assert post(url, "completions", {"prompt": PROMPT, "keep_alive": 300}).status_code == 200
    r = post(url, "chat/completions", {**base, "keep_alive": [True]})  # of Ollama's types only
    assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive", r.text


def test_a_refused_web_page_is_told_the_flag_and_warned_about_once(url):
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": HI},
        headers={"Origin": "http://localhost:3001"},
        timeout=30,
    )
    assert r.status_code == 403
    assert "--cors origins: --cors http://localhost:3001" in r.json()["error"]["message"]
    gate = SecurityGate(None, SecurityPolicy())
    err = APIError(403, "refused", code="origin_not_allowed")
    levels = [gate._level(err, o) for o in ["http://a.test", "http://a.test", "http://b.test"]]
    assert levels == [logging.WARNING, logging.INFO, logging.WARNING]
    assert gate._level(APIError(403, "x", code="host_not_allowed"), None) == logging.INFO


def test_the_serving_line_says_what_a_client_cannot_do_and_who_may(pair):
    """A model without tool calls, and the web pages --cors allows, are said at start."""
    from dflash2_cli.serve_run import who_is_served

    card = create_app(pair, model_name="tiny").state.card
    said = who_is_served(card, SecurityPolicy(api_key="k"))
    assert said == ", no tool calls (tools: a 400), API key required"
    allowed = SecurityPolicy(cors_origins=("http://localhost:3000", "http://x.test"))
    assert who_is_served(card, allowed).endswith(
        ", no API key, web pages from http://localhost:3000, http://x.test"
    )
    assert who_is_served(card, SecurityPolicy(cors_origins=("*",))).endswith("any origin")


def test_hidden_special_tokens_before_a_stop_string_stay_in_the_reply(pair):
    """skip_special_tokens hides a special token from the text; a stop string after it in the
    same round still ends the reply at the token that completes it (the hidden one and that
    token kept: usage counts both, as without skipping)."""
    from dflash2_mlx.engine.events import RoundEvent
    from dflash2_mlx.text import EventText

    a, b = pair.tokenizer.encode("ab")
    params = GenerationParams(max_tokens=8)
    hide = frozenset({IM_START})
    for hidden, text in ((frozenset(), "<|im_start|>"), (hide, "")):
        chunk = EventText(pair, PROMPT, params, ["a"], hidden).chunk(
            RoundEvent(tokens=[IM_START, a, b], drafted=2, accepted=2)
        )
        assert chunk.text == text and chunk.finish_reason == "stop"
        assert chunk.event.tokens == [IM_START, a]


def test_echo_keeps_a_hidden_generated_tokens_entry(url):
    """With echo the lists end with the generated token even when skip_special_tokens hides
    it from the text (lm-eval drops the last entry)."""
    body = {"prompt": PROMPT, "echo": True, "max_tokens": 1, "logprobs": 1}
    body |= {"logit_bias": {str(IM_START): 100}, "skip_special_tokens": True}
    r = post(url, "completions", body).json()["choices"][0]
    assert r["logprobs"]["tokens"][-1] == "<|im_start|>" and len(r["logprobs"]["tokens"]) == 5
    assert r["text"] == "".join(r["logprobs"]["tokens"][:-1])


@pytest.mark.parametrize("value", ["x", -1])
def test_a_bad_alias_value_is_named_as_sent(url, value):
    r = post(url, "chat/completions", {"messages": HI, "repeat_penalty": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "repeat_penalty", r.text
    assert "repeat_penalty" in r.json()["error"]["message"]


def test_no_limit_values_are_chat_and_completions_only(url):
    """Anthropic's required max_tokens and Responses' max_output_tokens keep their APIs' rule."""
    r = httpx.post(
        f"{url}/v1/messages", json={"model": "tiny", "messages": HI, "max_tokens": -1}, timeout=30
    )
    assert r.status_code == 400 and "max_tokens" in r.text
    r = post(url, "responses", {"input": "hi", "max_output_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens", r.text
