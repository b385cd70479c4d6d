"""`dflash2 serve` as clients meet it: what agent frameworks, editors and scripts send and
read back, beyond the fields themselves (test_serve.py). A real uvicorn server on 127.0.0.1
over the tiny random pair, the official openai client and raw HTTP.

- a request over the context is `context_length_exceeded` in OpenAI's words ("This model's
  maximum context length is N tokens"), prompt and max_tokens alike: agent frameworks
  (litellm / aider, CrewAI, ...) match that code or phrase to trim their history;
- newer OpenAI fields that cannot change the output are accepted at their neutral value;
  output-changing ones are refused by name, not as unknown;
- participant names (AutoGen and LangChain send `name` on messages) reach the model: through
  the chat template for the roles whose names it renders, else written before the text;
- a stream whose first token is slow (queue, long prefill) opens and sends SSE keep-alive
  comments, which the official client skips;
- routing errors say what to do: 405 carries `Allow`, HEAD works where GET does, a path
  without /v1 or an endpoint this server lacks names the one to use.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from test_serve import HI, make_tokenizer, metric, pair, running  # noqa: F401  (pair: fixture)

from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.serve import create_app
from dflash2_mlx.serve.limits import ServeLimits
from dflash2_mlx.serve.chat_prompt import ChatTemplate
from dflash2_mlx.text import chat_prompt_ids

CONTEXT = 64  # tokens; the tiny tokenizer has one token per character
HI_BODY = {"model": "tiny", "messages": HI}


@pytest.fixture(scope="module")
def url(pair):  # noqa: F811
    app = create_app(pair, model_name="tiny", context_length=CONTEXT, default_max_tokens=4)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# ------------------------------------------------------------------ context overflow
def test_context_overflow_reads_as_openai_context_length_exceeded(url, client):
    msgs = [{"role": "user", "content": "x" * 30}]
    with pytest.raises(openai.BadRequestError) as e:  # prompt fits, prompt + max_tokens not
        client.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=40)
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_completion_tokens"
    msg = e.value.message
    assert f"maximum context length is {CONTEXT} tokens" in msg, msg
    n_prompt = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=1
    ).usage.prompt_tokens
    assert f"you requested {n_prompt + 40} tokens ({n_prompt} in the messages, 40 in" in msg
    for path, body, param in (
        ("completions", {"prompt": "y" * 20, "max_tokens": 50}, "max_tokens"),
        ("completions", {"prompt": "y" * 80}, "prompt"),  # the prompt alone is too long
        ("chat/completions", {"messages": [{"role": "user", "content": "z" * 80}]}, "messages"),
    ):
        err = _error(httpx.post(f"{url}/v1/{path}", json=body), 400)
        assert err["code"] == "context_length_exceeded" and err["param"] == param, err
        assert f"maximum context length is {CONTEXT} tokens" in err["message"], err
    with pytest.raises(openai.BadRequestError) as e:  # the Responses API names its own field
        client.responses.create(model="tiny", input="x" * 30, max_output_tokens=40)
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_output_tokens"
    assert "in the input, 40 in" in e.value.message and "messages" not in e.value.message
    ok = client.completions.create(model="tiny", prompt="y" * 20, max_tokens=CONTEXT - 20)
    assert ok.usage.prompt_tokens + CONTEXT - 20 == CONTEXT  # the bound itself is allowed


# ------------------------------------------------------------------ newer OpenAI fields
def test_neutral_stream_options_and_harmless_fields_are_accepted(url, client):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=HI,
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": False},
            extra_body={"prompt_cache_retention": "24h"},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    body = {"messages": HI, "stream": True, "stream_options": {"include_obfuscation": True}}
    err = _error(httpx.post(url + "/v1/chat/completions", json=body), 400)
    assert err["param"] == "stream_options.include_obfuscation", err
    assert err["code"] == "unsupported_parameter"
    # accepted and unused, yet a value of the wrong type is the 400 OpenAI sends
    for field, value in (("user", 5), ("metadata", {"k": 1}), ("service_tier", [])):
        err = _error(
            httpx.post(url + "/v1/chat/completions", json={"messages": HI, field: value}), 400
        )
        assert err["param"] == field and err["code"] == "invalid_type", err
    err = _error(httpx.post(url + "/v1/completions", json={"prompt": "x", "user": {}}), 400)
    assert err["param"] == "user", err
    for seed in (-(2**63) - 1, 2**64):  # the message says the range the server takes
        err = _error(
            httpx.post(url + "/v1/chat/completions", json={"messages": HI, "seed": seed}), 400
        )
        assert "seed must be an integer in [-2**63, 2**64)" in err["message"], err


def test_output_changing_openai_fields_are_refused_by_name(url):
    body = {"messages": HI, "verbosity": "low"}
    err = _error(httpx.post(url + "/v1/chat/completions", json=body), 400)
    assert err["param"] == "verbosity" and err["code"] == "unsupported_parameter", err
    assert "Unrecognized" not in err["message"], err
    for neutral in (None, "medium"):  # "medium": OpenAI's default, what clients send
        body = {"messages": HI, "max_tokens": 2, "verbosity": neutral}
        ok = httpx.post(url + "/v1/chat/completions", json=body)
        assert ok.status_code == 200, ok.text


def test_reasoning_effort_on_a_model_that_never_thinks(url):
    """`none` is what it does anyway; an effort that asks for thinking is a 400 naming
    reasoning_effort (not the template variable it becomes)."""
    plain = httpx.post(url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 6})
    off = {"messages": HI, "max_tokens": 6, "reasoning_effort": "none"}
    r = httpx.post(url + "/v1/chat/completions", json=off)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    err = _error(
        httpx.post(url + "/v1/chat/completions", json={**off, "reasoning_effort": "high"}), 400
    )
    assert err["param"] == "reasoning_effort", err
    assert err["message"].startswith("reasoning_effort: ") and "never thinks" in err["message"]


# ------------------------------------------------------------------ participant names
def test_participant_names_are_written_before_the_text_when_the_template_drops_them(client):
    plain = [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]
    named = [{**plain[0], "name": "ops"}, {**plain[1], "name": "bob"}, {**HI[0], "name": ""}]

    def prompt_tokens(messages):
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=1
        ).usage.prompt_tokens

    # one token per character: each name adds exactly "name: " (an empty name adds nothing)
    assert prompt_tokens(named) == prompt_tokens(plain + HI) + len("ops: ") + len("bob: ")
    # a name that repeats its role (AutoGen's) says nothing and is not written
    roles = [{**plain[0], "name": "system"}, {**plain[1], "name": "User"}, *HI]
    assert prompt_tokens(roles) == prompt_tokens(plain + HI)
    # two assistant speakers, one named as its role: the other's name is still written
    said = {"role": "assistant", "content": "k"}
    two = [{**said, "name": "assistant"}, {**said, "name": "cr"}, {"role": "user", "content": "h"}]
    assert prompt_tokens(two) == prompt_tokens([said, said, two[-1]]) + len("cr: ")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi", "name": 7}]
        )
    assert e.value.param == "messages[0].name"


def test_a_template_that_renders_names_gets_them_as_they_are():
    tok = make_tokenizer()
    tok._tokenizer.chat_template = (  # renders user names only
        "{% for m in messages %}<|im_start|>{{ m.role }}"
        "{% if m.role == 'user' and m.name %} ({{ m.name }}){% endif %} {{ m.content }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": "yo", "name": "eve"},
        {"role": "assistant", "content": "no", "name": "max"},
        {"role": "user", "content": "ok"},
    ]
    p = ChatTemplate(tok).prompt(messages, None, {})
    text = tok.decode(p.ids)
    assert "<|im_start|>user (bob) hi<|im_end|>" in text  # the template's own rendering
    assert "<|im_start|>assistant eve: yo<|im_end|>" in text  # dropped by it: written
    written = [{"role": "assistant", "content": c} for c in ("eve: yo", "max: no")]
    assert p.ids == chat_prompt_ids(tok, [messages[0], *written, messages[3]])
    # one assistant name is the model's own: not written into its turns
    alone = ChatTemplate(tok).prompt(messages[:2] + messages[3:], None, {})
    assert alone.ids == chat_prompt_ids(
        tok, [messages[0], {"role": "assistant", "content": "yo"}, messages[3]]
    )
    # no chat template (the plain "role: text" fallback): every name is written
    tok._tokenizer.chat_template = None
    bare = ChatTemplate(tok).prompt(messages[:1], None, {})
    assert bare.ids == chat_prompt_ids(tok, [{"role": "user", "content": "bob: hi"}])


# ------------------------------------------------------------------ fill-in-the-middle
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


def test_a_completion_suffix_fills_in_the_middle_with_the_fim_tokens(pair):  # noqa: F811
    """Editors send the text after the cursor as `suffix`: a model with FIM tokens (Qwen's
    names here) gets <|fim_prefix|>prompt<|fim_suffix|>suffix<|fim_middle|>, and the greedy
    middle is plain greedy decoding of exactly that; an empty prompt (the cursor at the
    start) or suffix (at the end) is a middle too. A marker's text in the file is text: the
    server builds the frame. A model without them refuses `suffix` (test_serve.py's BAD),
    save an empty one: a plain completion is all it asks there."""
    import tiny

    from dflash2_mlx.api import Pair

    tok = make_tokenizer(extra_specials=FIM)
    fim = Pair.from_models(pair.model, tok, pair.drafter)
    pre, suf, mid = tok.convert_tokens_to_ids(list(FIM))

    def enc(text: str) -> list[int]:  # as the server takes a file's text (fim.fim_text)
        return tok.encode(text, add_special_tokens=False, split_special_tokens=True)

    marker = "FIM = ('<|fim_prefix|>', "  # editing a tokenizer's own source
    assert len(enc(marker)) > len(tok.encode(marker, add_special_tokens=False)) + 5
    with running(create_app(fim, model_name="tiny", default_max_tokens=10)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        cases = (
            ("def f(x):\n    ", "\n    return y\n"),
            ("", "x = 1"),
            ("y = [1, 2]\nz = ", ""),
            ("", ""),  # a new, empty file
            (marker, "'<|fim_suffix|>')\n"),
        )
        for prompt, suffix in cases:
            ids = [pre, *enc(prompt), suf, *enc(suffix), mid]
            want = tiny.greedy_reference(fim.model, ids, 10, eos={tok.eos_token_id})
            r = client.completions.create(
                model="tiny", prompt=prompt, suffix=suffix, max_tokens=10, temperature=0
            )
            assert r.usage.prompt_tokens == len(ids)
            assert r.choices[0].text == tok.decode([t for t in want if t != tok.eos_token_id])
    with running(create_app(pair, model_name="tiny", default_max_tokens=10)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        plain = client.completions.create(model="tiny", prompt="ab", suffix="", max_tokens=4)
        assert plain.usage.prompt_tokens == 2  # no FIM tokens: "" asks nothing more


# ------------------------------------------------------------------ keep-alive
def test_a_stream_waiting_for_its_first_token_is_kept_alive(pair):  # noqa: F811
    with pytest.raises(DFlash2Error, match="keepalive_s must be > 0"):
        ServeLimits(keepalive_s=0)
    for grace in (-1.0, float("inf"), float("nan")):  # --shutdown-grace inf would never end
        with pytest.raises(DFlash2Error, match="shutdown_grace_s must be >= 0 and finite"):
            ServeLimits(shutdown_grace_s=grace)
    limits = ServeLimits(keepalive_s=0.001)  # shorter than any prefill of 1,500 tokens
    app = create_app(pair, model_name="tiny", default_max_tokens=6, limits=limits)
    messages = [{"role": "user", "content": "ab " * 500}]
    body = {"model": "tiny", "messages": messages, "stream": True}
    with running(app) as base:
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
        assert first_data > 0 and set(lines[:first_data]) == {": keep-alive"}, lines[:3]
        assert lines[-1] == "data: [DONE]"
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        streamed = client.chat.completions.create(model="tiny", messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        whole = client.chat.completions.create(model="tiny", messages=messages)
        assert text == whole.choices[0].message.content and text


def test_a_client_leaving_during_the_keep_alive_wait_cancels_its_request(pair):  # noqa: F811
    limits = ServeLimits(keepalive_s=0.001)
    app = create_app(pair, model_name="tiny", max_batch=1, default_max_tokens=6, limits=limits)
    long = {"model": "tiny", "messages": [{"role": "user", "content": "ab " * 500}]}
    with running(app) as base:
        url = base + "/v1/chat/completions"
        holder = threading.Thread(
            target=httpx.post, args=(url,), kwargs={"json": long, "timeout": 60}
        )
        holder.start()  # holds the only row while the next request waits behind it
        # a long prompt of its own too: waiting or prefilling, it has no token after 1 ms
        leaving = {**long, "messages": [{"role": "user", "content": "cd " * 400}], "stream": True}
        with httpx.stream("POST", url, json=leaving, timeout=30) as r:
            assert r.status_code == 200
            assert next(line for line in r.iter_lines() if line) == ": keep-alive"
        holder.join(60)
        deadline = time.time() + 10
        while metric(httpx.get(base + "/metrics").text, "dflash2_cancelled_total") < 1:
            assert time.time() < deadline, "the left request was not cancelled"
            time.sleep(0.05)
        again = httpx.post(url, json={**HI_BODY, "max_tokens": 3}, timeout=30)
        assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"]


# ------------------------------------------------------------------ routing
def test_wrong_method_names_the_allowed_ones_and_head_works(url):
    r = httpx.get(url + "/v1/chat/completions")
    assert _error(r, 405)["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    r = httpx.delete(url + "/v1/models")
    assert _error(r, 405)["code"] == "method_not_allowed" and "GET" in r.headers["allow"]
    for path in ("/health", "/v1/models", "/v1/models/tiny", "/metrics"):
        head, get = httpx.head(url + path), httpx.get(url + path)
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]


def test_not_found_names_the_endpoint_to_use(url):
    for path, hint in (
        ("/chat/completions", "/v1/chat/completions"),
        ("/completions", "/v1/completions"),
        ("/models", "/v1/models"),
        ("/responses", "/v1/responses"),
        ("/v1/responses/resp_1", "Responses are not stored"),
        ("/v1/embeddings", "/v1/chat/completions"),
        ("/v1/chat/completions/", "Did you mean /v1/chat/completions? (without the trailing"),
        ("/chat/completions/", "Did you mean /v1/chat/completions?"),
    ):
        r = httpx.post(url + path, json={"model": "tiny", "input": "hi"})
        err = _error(r, 404)
        assert err["code"] == "not_found" and hint in err["message"], (path, err)
    err = _error(httpx.get(url + "/v2/nothing"), 404)
    assert err["message"].startswith("GET /v2/nothing: Not Found"), err


def test_client_bookkeeping_on_messages_is_accepted(url):
    """LiteLLM sends a reply's `provider_specific_fields` back with it (a second turn was a
    400); SDK dumps and chat UIs send message ids. Neither instructs the model."""
    from dflash2_mlx.serve.chat_messages import message

    reply = {"role": "assistant", "content": "hello", "id": "m2"}
    reply["provider_specific_fields"] = {"reasoning": "greet back"}
    msgs = [
        {"role": "user", "content": "hi", "id": "m1", "provider_specific_fields": []},
        reply,
        *HI,
    ]
    ok = httpx.post(url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    assert message(1, reply) == {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "greet back",  # where the message gives none of its own
    }
    own = message(1, {**reply, "reasoning_content": "own"})
    assert own["reasoning_content"] == "own"
    for at, fields, param in (
        (1, "x", "messages[1].provider_specific_fields"),
        (1, {"reasoning": 3}, "messages[1].provider_specific_fields.reasoning"),
        (0, "x", "messages[0].provider_specific_fields"),  # on any message
    ):
        bad = [msgs[0], reply, *HI]
        bad[at] = {**bad[at], "provider_specific_fields": fields}
        err = _error(httpx.post(url + "/v1/chat/completions", json={"messages": bad}), 400)
        assert err["param"] == param and err["code"] == "invalid_type", err
    err = _error(  # a field that would instruct the model is still refused by name
        httpx.post(url + "/v1/chat/completions", json={"messages": [{**HI[0], "prefix": True}]}),
        400,
    )
    assert err["param"] == "messages[0].prefix" and err["code"] == "unsupported_parameter", err
