"""`dflash2 serve`: a real uvicorn server on a tiny random pair, driven by the openai client
and raw HTTP. Greedy output equals plain greedy decoding; bad input gets a 4xx and the server
keeps serving; the queue bound answers 503; a client that leaves frees the worker."""

from __future__ import annotations

import contextlib
import re
import socket
import string
import subprocess
import threading
import time

import httpx
import openai
import pytest
import tiny
import uvicorn

from dflash2_mlx.api import Pair
from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.serve import create_app
from dflash2_mlx.settings import Drafting
from dflash2_mlx.text import chat_prompt_ids

EOS = 2
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HI = [{"role": "user", "content": "Hi there"}]


def make_tokenizer(vocab_size: int = tiny.VOCAB, extra_specials: tuple[str, ...] = ()):
    """A real HF fast tokenizer over the tiny vocabulary: one token per character, specials
    <|im_start|> / <|im_end|> (EOS), `extra_specials` after them (in place of the last
    characters), <mask> last (the drafter's mask id), a chat template."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", *extra_specials]
    chars = list(string.ascii_letters + string.digits + " \n" + string.punctuation)
    vocab = specials + chars[: vocab_size - len(specials) - 1] + ["<mask>"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", *extra_specials, "<mask>"],
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = TEMPLATE
    assert hf.eos_token_id == EOS
    return TokenizerWrapper(hf)


def slow_pair(step_s: float, prefill_chunk: int | None = None) -> Pair:
    """A tiny pair of its own whose every target forward (a prefill chunk, a verify) takes at
    least `step_s`: a long prefill or stream outlasts a test's waits on a fast machine too."""
    slow = Pair.from_models(
        tiny.make_target("llama"),
        make_tokenizer(),
        tiny.make_drafter(2, block_size=4),
        prefill_chunk=prefill_chunk,
    )
    adapter, forward = slow.decoder.target, slow.decoder.target.forward

    def slow_forward(*args, **kwargs):
        time.sleep(step_s)
        return forward(*args, **kwargs)

    adapter.forward = slow_forward  # this pair's alone
    return slow


def wait_until_serving(base: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    """Poll /health until a `dflash2 serve` subprocess answers 200 (or it exits, or time is up)."""
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1]


@contextlib.contextmanager
def running(app):
    """Serve `app` with uvicorn on a free 127.0.0.1 port in a thread; yield its base URL."""
    # said to be TCP, so asyncio sets TCP_NODELAY (lifecycle._said_tcp): no ~40 ms a request
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="module")
def pair():
    model = tiny.make_target("llama")
    return Pair.from_models(model, make_tokenizer(), tiny.make_drafter(2, block_size=4))


@pytest.fixture(scope="module")
def url(pair):
    app = create_app(
        pair,
        model_name="tiny",
        max_queue=8,
        context_length=None,
        default_max_tokens=8,
        drafter_name="tiny-dflash2",
    )
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def reference(pair, ids, n):
    """Plain greedy decoding of `ids` as (text without EOS, token count)."""
    out = tiny.greedy_reference(pair.model, ids, n, eos={EOS})
    return pair.tokenizer.decode([t for t in out if t != EOS]), len(out)


def metric(text: str, name: str, **labels) -> float:
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(
        rf"^{re.escape(name)}{re.escape('{' + lab + '}') if lab else ''} (\S+)$", text, re.M
    )
    return float(m.group(1)) if m else 0.0


# ------------------------------------------------------------------ happy paths
def test_greedy_chat_equals_plain_greedy(pair, client):
    want, n = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 12)
    r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == ("length" if n == 12 else "stop")
    assert r.usage.prompt_tokens == len(chat_prompt_ids(pair.tokenizer, HI))
    assert r.usage.completion_tokens == n
    assert r.usage.total_tokens == r.usage.prompt_tokens + n
    ext = r.usage.model_extra["dflash2"]
    assert ext["block_size"] == 4 and ext["speculative"] is True
    assert 0 <= ext["accepted"] <= ext["drafted"] and ext["rounds"] >= 1
    assert ext["tau"] == pytest.approx((ext["accepted"] + ext["rounds"]) / ext["rounds"], abs=1e-3)


def test_predicted_outputs_draft_and_change_nothing(pair, client):
    """OpenAI's Predicted Outputs: the expected answer is drafted from; the output is still
    exactly greedy, and usage counts the prediction's tokens that appeared in the completion
    (accepted) and those that did not (rejected), as OpenAI's API does."""
    want, n = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 16)
    for guess, accepted in ((want, True), ("zz" + want[2:], True), ("qqqq", False)):
        size = len(pair.tokenizer.encode(guess, add_special_tokens=False))
        r = client.chat.completions.create(
            model="tiny",
            messages=HI,
            max_tokens=16,
            temperature=0,
            prediction={"type": "content", "content": [{"type": "text", "text": guess}]},
        )
        assert r.choices[0].message.content == want, guess
        details = r.usage.completion_tokens_details
        used, unused = details.accepted_prediction_tokens, details.rejected_prediction_tokens
        assert used + unused == size, (guess, r.usage)
        assert (used > 0) == accepted, (guess, r.usage)
    r = client.chat.completions.create(
        model="tiny",
        messages=HI,
        max_tokens=16,
        temperature=0,
        prediction={"type": "content", "content": want},
    )
    details = r.usage.completion_tokens_details  # the answer itself: every token appeared
    assert details.accepted_prediction_tokens == len(pair.tokenizer.encode(want)), r.usage
    assert details.rejected_prediction_tokens == 0, r.usage


def test_without_speculation_a_prediction_is_refused_and_drafting_knobs_too(pair):
    """--no-spec decodes without drafts: a Predicted Outputs hint cannot be honoured (a 400
    naming it, not silently dropped); a block size for such a server is refused at start."""
    want, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 12)
    with running(create_app(pair, model_name="tiny", drafting=Drafting(False))) as base:
        plain = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        r = plain.chat.completions.create(model="tiny", messages=HI, max_tokens=12)
        assert r.choices[0].message.content == want
        with pytest.raises(openai.BadRequestError) as err:
            plain.chat.completions.create(
                model="tiny",
                messages=HI,
                max_tokens=12,
                prediction={"type": "content", "content": want},
            )
        assert err.value.body["param"] == "prediction" and "--no-spec" in err.value.body["message"]
        card = httpx.get(base + "/v1/models").json()["data"][0]["dflash2"]
        assert (card["speculative"], card["lookup"], card["datastore"]) == (False, 0, False)
    for knob in (dict(block=2), dict(lookup_block=8)):
        with pytest.raises(DFlash2Error, match="has no effect with speculative=False"):
            create_app(pair, model_name="tiny", drafting=Drafting(False, **knob))


def test_greedy_completion_stream_token_prompt(pair, client):
    ids = [5, 9, 14, 20, 33, 40]
    want, _ = reference(pair, ids, 10)
    chunks = list(
        client.completions.create(
            model="tiny", prompt=ids, max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk
    text = client.completions.create(
        model="tiny", prompt=pair.tokenizer.decode(ids), max_tokens=10, temperature=0
    )
    assert text.choices[0].text == want  # a string prompt tokenizes to the same ids


def test_the_earliest_stop_string_ends_the_text(pair):
    """Stop strings listed in any order: the one that comes first in the text cuts it (a
    round adds several tokens, so two may arrive at once)."""
    from dflash2_mlx.text import TextStream

    ids = pair.tokenizer.encode("ab</x> cd END ef", add_special_tokens=False)
    for stops in (["END", "</x>"], ["</x>", "END"]):
        stream = TextStream(pair.tokenizer, stops)
        text, hit = stream.feed(ids, final=True)
        assert (text, hit, stream.hit) == ("ab", True, "</x>"), stops
    # "c" is completed before "abcd" is: one token at a time or a whole round alike
    ids = pair.tokenizer.encode("xabcd", add_special_tokens=False)
    one, alone = TextStream(pair.tokenizer, ["abcd", "c"]), ""
    for t in ids:
        part, hit = one.feed([t], final=False)
        alone += part
        if hit:
            break
    whole = TextStream(pair.tokenizer, ["abcd", "c"])
    assert alone == whole.feed(ids, final=True)[0] == "xab" and one.hit == whole.hit == "c"


def test_stream_include_usage_and_stop_string(pair, client):
    want, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 12)
    stop = want[4:6]
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=HI,
            max_tokens=12,
            temperature=0,
            stop=[stop, "\x00never"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want[: want.find(stop)] and stop not in text
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == ["stop"]
    last = chunks[-1]
    # usage counts the tokens plain decoding generates until the stop string is complete
    ids = tiny.greedy_reference(pair.model, chat_prompt_ids(pair.tokenizer, HI), 12, eos={EOS})
    upto = next(n for n in range(1, len(ids) + 1) if stop in pair.tokenizer.decode(ids[:n]))
    assert last.choices == [] and last.usage.completion_tokens == upto
    # the prediction is the answer: one round commits it all, past the stop string
    whole = client.chat.completions.create(
        model="tiny",
        messages=HI,
        max_tokens=12,
        temperature=0,
        stop=[stop],
        prediction={"type": "content", "content": want},
    )
    assert whole.usage.model_extra["dflash2"]["rounds"] <= 2
    assert whole.choices[0].message.content == want[: want.find(stop)]
    assert whole.usage.completion_tokens == upto
    assert set(last.usage.model_extra["dflash2"]) >= {
        "rounds",
        "drafted",
        "accepted",
        "tau",
        "block_size",
    }


def test_a_stop_the_first_token_completes_ends_it_before_any_round(pair, url, client):
    """The first token goes out from the prefill, before a round runs: its time to first
    token is the prefill's, and a stop it completes (an editor's "\n" at a line's end)
    ends the request with no round run at all."""
    first = tiny.greedy_reference(pair.model, chat_prompt_ids(pair.tokenizer, HI), 1, eos={EOS})
    stop = pair.tokenizer.decode(first)
    assert first != [EOS] and stop.strip()

    def rounds() -> float:
        return metric(httpx.get(url + "/metrics").text, "dflash2_batch_rows_count")

    before = rounds()
    r = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=12, temperature=0, stop=[stop]
    )
    assert r.choices[0].message.content == "" and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 1 and r.usage.model_extra["dflash2"]["rounds"] == 0
    assert rounds() == before  # no round ran for it


def test_sampling_is_seeded_and_not_greedy(pair, client):
    greedy, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 12)
    kw = dict(
        model="tiny",
        messages=HI,
        max_tokens=12,
        seed=7,
        top_p=0.95,
        extra_body={"top_k": 50, "min_p": 0.001},
    )
    a = client.chat.completions.create(temperature=5.0, **kw).choices[0].message.content
    b = client.chat.completions.create(temperature=5.0, **kw).choices[0].message.content
    assert a == b and a != greedy
    # OpenAI's ranges: an int64 seed (-1 draws as its uint64 bits); top_p 0 keeps the most
    # likely token only, which is greedy decoding
    c = client.chat.completions.create(temperature=5.0, **{**kw, "seed": -1})
    d = client.chat.completions.create(temperature=5.0, **{**kw, "seed": 2**64 - 1})
    assert c.choices[0].message.content == d.choices[0].message.content
    kw = {**kw, "top_p": 0, "extra_body": {}}
    assert client.chat.completions.create(temperature=5.0, **kw).choices[0].message.content == (
        greedy
    )


def test_four_concurrent_requests_succeed(client):
    results = [None] * 4

    def one(i):
        results[i] = (
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"q{i}"}],
                max_tokens=5,
                temperature=0,
            )
            .choices[0]
            .message.content
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(r, str) for r in results)


def test_models_health_and_harmless_fields(url):
    models = httpx.get(url + "/v1/models").json()
    card = models["data"][0]
    assert card["id"] == "tiny" and card["object"] == "model"
    # Anthropic's model fields and list paging, which its SDKs read
    assert card["type"] == "model" and card["display_name"] == "tiny"
    assert (card["lifecycle"], card["max_input_tokens"], card["max_tokens"]) == (
        "active",
        4095,
        4095,
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", card["created_at"])
    assert (models["has_more"], models["first_id"], models["last_id"]) == (False, "tiny", "tiny")
    assert card["dflash2"] == {
        "speculative": True,
        "target": None,  # create_app was given no target_name
        "weights": "target float32; drafter float32",
        "drafter": "tiny-dflash2",
        "drafter_version": 2,
        "draft_vocab": None,
        "lookup": 3,
        "datastore": False,  # the tiny drafter ships none
        "block_size": 4,
        "block_by_context": [],  # the autotuner's: none without a profile
        "block_by_temperature": [],
        "trained_block_size": 4,
        "context_length": 4096,
        "default_max_tokens": 8,
        "max_queue": 8,
        "max_batch": 8,
        "tool_calling": False,
        "thinking": None,
        "thinking_budget": None,
        "prompt_cache_mb": 1024,
    }
    assert httpx.get(url + "/v1/models/tiny").json()["id"] == "tiny"
    assert httpx.get(url + "/v1/models/tiny/").json()["id"] == "tiny"  # a joined path's slash
    assert httpx.get(url + "/v1/models/").json()["data"][0]["id"] == "tiny"
    assert httpx.get(url + "/health").json()["status"] == "ok"
    r = httpx.post(
        url + "/v1/chat/completions",
        json={
            "messages": HI,
            "user": "u1",
            "metadata": {"k": "v"},
            "n": 1,
            "presence_penalty": 0,
            "logprobs": False,
            "tools": [],
            "tool_choice": "none",
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
            "include_stop_str_in_output": False,  # vLLM's, at what this server does
            "skip_special_tokens": False,
        },
    )  # a model that does not think
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 8  # default_max_tokens


def test_penalties_and_logit_bias_equal_plain_decoding_with_them(pair, client):
    """mlx_lm.server's penalty fields: the reply is mlx-lm's plain greedy decoding with the
    same logits processors, whole and streamed, chat and completions."""
    from test_processors import mlx_lm_reference

    from dflash2_mlx.engine.processors import penalties

    fields = {"frequency_penalty": 1.2, "presence_penalty": 0.4, "logit_bias": {"7": 3.5}}
    extra = {"repetition_penalty": 1.5, "repetition_context_size": 8}

    def procs(prompt):  # presence and frequency count the completion only
        settings = {**fields, "logit_bias": {7: 3.5}, **extra}
        return penalties(pair.decoder.target.vocab_size, len(prompt), **settings)

    ids = chat_prompt_ids(pair.tokenizer, HI)
    want = mlx_lm_reference(pair.model, ids, 24, procs(ids))
    assert want != tiny.greedy_reference(pair.model, ids, 24), "the penalties should matter"
    want = want[: want.index(EOS)] if EOS in want else want
    kw = dict(model="tiny", messages=HI, max_tokens=24, temperature=0, extra_body=extra)
    r = client.chat.completions.create(**kw, **fields)
    assert r.choices[0].message.content == pair.tokenizer.decode(want)
    chunks = client.chat.completions.create(**kw, **fields, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        pair.tokenizer.decode(want)
    )
    plain = [3, 9, 4]
    want = mlx_lm_reference(pair.model, plain, 16, procs(plain))
    want = want[: want.index(EOS)] if EOS in want else want
    r = client.completions.create(
        model="tiny", prompt=plain, max_tokens=16, temperature=0, extra_body=extra, **fields
    )
    assert r.choices[0].text == pair.tokenizer.decode(want)


# ------------------------------------------------------------------ bad input
LONG = "x" * 5000  # > the context (4096 tokens: one per character)
BAD = [
    ("chat", b"{not json", 400, None),
    ("chat", b"[1, 2]", 400, None),
    ("chat", {"messages": "hi"}, 400, "messages"),
    ("chat", {"messages": []}, 400, "messages"),
    ("chat", {}, 400, "messages"),
    ("chat", {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ("chat", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("chat", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id"),
    ("chat", {"messages": HI, "model": "gpt-4"}, 404, "model"),
    ("chat", {"messages": HI, "max_tokens": 0}, 400, "max_tokens"),
    ("chat", {"messages": HI, "max_tokens": -3}, 400, "max_tokens"),
    ("chat", {"messages": HI, "max_tokens": "12"}, 400, "max_tokens"),
    ("chat", {"messages": HI, "max_completion_tokens": 10**9}, 400, "max_completion_tokens"),
    ("chat", {"messages": HI, "temperature": -1}, 400, "temperature"),
    ("chat", {"messages": HI, "temperature": "hot"}, 400, "temperature"),
    ("chat", {"messages": HI, "top_p": -0.1}, 400, "top_p"),
    ("chat", {"messages": HI, "top_p": 1.5}, 400, "top_p"),
    ("chat", {"messages": HI, "top_k": 2.5}, 400, "top_k"),
    ("chat", {"messages": HI, "min_p": 1.5}, 400, "min_p"),
    ("chat", {"messages": HI, "seed": -(2**63) - 1}, 400, "seed"),
    ("chat", {"messages": HI, "seed": 2**64}, 400, "seed"),
    ("chat", {"messages": HI, "stop": 5}, 400, "stop"),
    ("chat", {"messages": HI, "stream": "yes"}, 400, "stream"),
    ("chat", {"messages": HI, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("chat", {"messages": HI, "n": 9}, 400, "n"),
    ("completions", {"prompt": "ab", "n": 0}, 400, "n"),
    ("chat", {"messages": HI, "n": "2"}, 400, "n"),
    (
        "chat",
        {
            "messages": HI,
            "logprobs": True,
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        400,
        "logprobs",
    ),
    (
        "chat",
        {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]},
        400,
        "tools",
    ),
    (  # this template renders an assistant turn's content only: the call would vanish
        "chat",
        {
            "messages": HI
            + [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ]
        },
        400,
        "messages[1].tool_calls",
    ),
    ("chat", {"messages": HI, "response_format": {"type": "grammar"}}, 400, "response_format.type"),
    (
        "chat",
        {"messages": HI, "response_format": {"type": "json_schema"}},
        400,
        "response_format.json_schema",
    ),
    (
        "chat",
        {"messages": HI, "chat_template_kwargs": {"enable_thinking": True}},
        400,
        "chat_template_kwargs.enable_thinking",
    ),
    ("chat", {"messages": HI, "presence_penalty": "0.5"}, 400, "presence_penalty"),
    ("chat", {"messages": HI, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("chat", {"messages": HI, "repetition_context_size": 2**40}, 400, "repetition_context_size"),
    ("chat", {"messages": HI, "presence_penalty": 10**400}, 400, "presence_penalty"),
    ("chat", {"messages": HI, "logit_bias": {"3": 10**400}}, 400, "logit_bias"),
    ("chat", {"messages": HI, "repetition_context_size": 1.5}, 400, "repetition_context_size"),
    ("chat", {"messages": HI, "logit_bias": {"500": 10}}, 400, "logit_bias"),
    ("chat", {"messages": HI, "logit_bias": {"a": 10}}, 400, "logit_bias"),
    ("chat", {"messages": HI, "logit_bias": {"1_0": 10}}, 400, "logit_bias"),  # int() reads 10
    ("chat", {"messages": HI, "logit_bias": {"\u0665": 10}}, 400, "logit_bias"),  # Arabic 5
    ("completions", {"prompt": "ab", "logit_bias": {"5": "x"}}, 400, "logit_bias"),
    ("chat", {"messages": HI, "frobnicate": 1}, 400, "frobnicate"),
    (
        "chat",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        "messages[0].content[0].text",
    ),
    (
        "chat",
        {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]},
        400,
        "messages[0].content[0]",
    ),
    ("chat", {"messages": HI, "continue_final_message": True}, 400, "messages[0]"),
    (
        "chat",
        {"messages": [{"role": "assistant", "content": "a"}], "continue_final_message": True},
        400,
        "messages",
    ),
    (
        "chat",
        {"messages": HI + [{"role": "user", "content": "x"}], "continue_final_message": True},
        400,
        "messages[1]",
    ),
    (
        "chat",
        {"messages": HI, "continue_final_message": True, "add_generation_prompt": True},
        400,
        "add_generation_prompt",
    ),
    (
        "chat",
        {
            "messages": HI + [{"role": "assistant", "content": "{"}],
            "continue_final_message": True,
            "response_format": {"type": "json_object"},
        },
        400,
        "response_format",
    ),
    ("chat", {"messages": HI, "continue_final_message": "yes"}, 400, "continue_final_message"),
    ("chat", {"messages": HI, "prediction": "abc"}, 400, "prediction"),
    (
        "chat",
        {"messages": HI, "prediction": {"type": "text", "content": "a"}},
        400,
        "prediction.type",
    ),
    (
        "chat",
        {"messages": HI, "prediction": {"type": "content", "content": 5}},
        400,
        "prediction.content",
    ),
    (
        "chat",
        {"messages": HI, "prediction": {"type": "content", "content": "a", "x": 1}},
        400,
        "prediction.x",
    ),
    (
        "completions",
        {"prompt": "ab", "prediction": {"type": "content", "content": "a"}},
        400,
        "prediction",
    ),
    ("chat", {"messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("completions", {"prompt": LONG}, 400, "prompt"),
    ("completions", {"prompt": ""}, 400, "prompt"),
    ("completions", {"prompt": [1, 500]}, 400, "prompt"),
    ("completions", {"prompt": ["a", 5]}, 400, "prompt[1]"),
    ("completions", {"prompt": ["a", ""]}, 400, "prompt[1]"),
    ("completions", {"prompt": "ab", "echo": "yes"}, 400, "echo"),
    ("completions", {"prompt": "ab", "echo": True, "suffix": "cd"}, 400, "echo"),
    ("completions", {"prompt": "ab", "max_tokens": 0}, 400, "max_tokens"),  # 0: echo's only
    ("completions", {"prompt": "ab", "echo": True, "max_tokens": -3}, 400, "max_tokens"),
    ("completions", {"prompt": "ab", "best_of": 3}, 400, "best_of"),
    (
        "completions",
        {"prompt": "ab", "include_stop_str_in_output": True},
        400,
        "include_stop_str_in_output",
    ),
    ("chat", {"messages": HI, "skip_special_tokens": True}, 400, "skip_special_tokens"),
    ("completions", {"prompt": "ab", "suffix": "cd"}, 400, "suffix"),  # no FIM tokens
    ("completions", {"prompt": "", "suffix": "cd"}, 400, "suffix"),
    ("completions", {"prompt": "ab", "suffix": 5}, 400, "suffix"),
    ("completions", {"prompt": "ab", "max_tokens": 4095}, 400, "max_tokens"),
    ("chat", {"messages": [{"role": "user", "content": []}]}, 400, "messages[0].content"),
]


@pytest.mark.parametrize(
    "endpoint,body,status,param", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)]
)
def test_bad_input_is_a_clean_4xx(url, endpoint, body, status, param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(
        f"{url}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}",
        headers={"content-type": "application/json"},
        **kw,
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param


@pytest.mark.parametrize(
    "path,extra,field",
    [
        ("/v1/messages", {"thinking": {"type": "enabled"}}, "thinking.type"),
        ("/v1/responses", {"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ],
)
def test_a_translated_field_is_named_as_sent(url, path, extra, field):
    """The thinking switch this template lacks is named as the client sent it, with no
    value of the translated request in the message."""
    base = {"max_tokens": 4, "messages": HI} if path == "/v1/messages" else {"input": "hi"}
    r = httpx.post(url + path, json={**base, **extra})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith(field + ":") and "True" not in message, message


CALL_ITEM = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
TOOL_USE = {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "c1", "content": "42"}


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/v1/responses", {"input": [{"role": "user", "content": "hi"}, CALL_ITEM]}, "input[1]"),
        (  # an assistant message, then its call as an item of its own
            "/v1/responses",
            {"input": [*HI, {"role": "assistant", "content": "ok"}, CALL_ITEM]},
            "input[2]",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": [
                    *HI,
                    {"role": "assistant", "content": [TOOL_USE]},
                    {"role": "user", "content": [TOOL_RESULT]},
                ],
            },
            "messages[1].content",
        ),
        (  # joined into the turn before it (as Anthropic joins consecutive turns)
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": [
                    *HI,
                    {"role": "assistant", "content": "let me see"},
                    {"role": "assistant", "content": [TOOL_USE]},
                    {"role": "user", "content": [TOOL_RESULT]},
                ],
            },
            "messages[2].content",
        ),
    ],
)
def test_a_call_the_template_cannot_render_is_named_where_it_was_sent(url, path, body, field):
    """Responses and Messages carry calls as items and blocks: no `tool_calls` field is named."""
    r = httpx.post(url + path, json=body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith(field + ": this model's chat template"), message
    assert "tool_calls" not in message


def test_an_unknown_field_sent_as_null_asks_nothing_and_passes(url):
    """SDKs and proxies send unset fields as null; only a value would be ignored."""
    body = {"messages": HI, "max_tokens": 1, "frobnicate": None}
    assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 200
    body = {"input": "hi", "max_output_tokens": 16, "frobnicate": None}
    assert httpx.post(url + "/v1/responses", json=body).status_code == 200
    body["frobnicate"] = 1
    assert httpx.post(url + "/v1/responses", json=body).json()["error"]["param"] == "frobnicate"


def test_an_assistant_refusal_part_is_its_text(url):
    """OpenAI's history may hold an assistant's refusal as a content part: it is that turn's
    text, as a string content would be."""

    def prompt_tokens(content, **fields) -> int:
        messages = [*HI, {"role": "assistant", "content": content, **fields}, *HI]
        body = {"messages": messages, "max_tokens": 1}
        return httpx.post(url + "/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]

    refused = prompt_tokens([{"type": "refusal", "refusal": "no way"}])
    assert refused == prompt_tokens("no way") != prompt_tokens("")
    # the message's own `refusal` field (content null), as OpenAI's replies carry it
    assert prompt_tokens(None, refusal="no way") == refused
    bad = {"messages": [*HI, {"role": "assistant", "content": None, "refusal": 3}, *HI]}
    err = httpx.post(url + "/v1/chat/completions", json=bad).json()["error"]
    assert err["param"] == "messages[1].refusal" and "must be a string" in err["message"]


def test_unknown_route_and_method(url):
    assert httpx.get(url + "/v2/nothing").json()["error"]["code"] == "not_found"
    r = httpx.get(url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(url + "/v1/models/other").status_code == 404
    slash = httpx.post(url + "/v1/chat/completions/", json={})
    assert slash.status_code == 404 and slash.json()["error"]["code"] == "not_found"


def test_a_request_may_name_the_model_by_another_name(pair):
    """`other_names` (an alias's synonyms, `dflash2 serve` passes them): a request naming one,
    in any case, is served and answered under the served name; any other name is a 404."""
    app = create_app(pair, model_name="tiny", other_names=("Tiny-Alias",), default_max_tokens=2)
    with running(app) as base:
        chat = base + "/v1/chat/completions"
        ok = httpx.post(chat, json={"messages": HI, "model": "TINY-alias"})
        assert ok.status_code == 200 and ok.json()["model"] == "tiny"
        assert httpx.get(base + "/v1/models/tiny-alias").json()["id"] == "tiny"
        err = httpx.post(chat, json={"messages": HI, "model": "tiny-2"})
        assert err.status_code == 404 and err.json()["error"]["code"] == "model_not_found"
        # mlx_lm.server's name for the model it serves, which its clients send
        ok = httpx.post(chat, json={"messages": HI, "model": "default_model"})
        assert ok.status_code == 200 and ok.json()["model"] == "tiny"


# ------------------------------------------------------------------ queue, disconnect, metrics
# 4,000 tokens with the end-of-turn banned: the tiny pair's greedy "abc" ends at 1,860 on its
# own, within 3 s on a fast machine, where tests expect it still running
LONG_BODY = {"prompt": "abc", "max_tokens": 4000, "temperature": 0, "logit_bias": {str(EOS): -100}}


def _open_long_stream(http: httpx.Client, url: str):
    """Start a long streaming generation; return once it has produced text.

    Returns the stream's context manager and its line iterator: closing the iterator (a
    `for ... break`) would close the connection, so the caller keeps both alive.
    """
    cm = http.stream("POST", url + "/v1/completions", json={**LONG_BODY, "stream": True})
    r = cm.__enter__()
    assert r.status_code == 200
    lines = r.iter_lines()
    while not (line := next(lines)).startswith('data: {"id"') or '"text": ""' in line:
        pass
    return cm, lines


def test_a_worker_that_dies_answers_its_request_and_refuses_the_next(pair):
    """A failure nothing catches ends the generation worker: its running request gets the
    error (a 500, not a hang) and later ones a 503, never a queue nobody serves."""
    app = create_app(pair, model_name="tiny", default_max_tokens=4)

    def broken(*_):
        raise RuntimeError("injected")

    with running(app) as base, httpx.Client(timeout=30) as http:
        scheduler = app.state.worker.scheduler
        scheduler._step = broken  # this server's instance: the step fails ...
        scheduler._fail_all = broken  # ... and so does its handler
        body = {"prompt": "q", "max_tokens": 4, "temperature": 0}
        r = http.post(base + "/v1/completions", json=body)
        assert r.status_code == 500, r.text
        r = http.post(base + "/v1/completions", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        assert http.get(base + "/health").status_code == 503


def test_client_disconnect_frees_the_worker(url, client):
    before = httpx.get(url + "/metrics").text
    with httpx.Client(timeout=60) as http:
        cm, _lines = _open_long_stream(http, url)
        cm.__exit__(None, None, None)  # the client leaves mid-stream
    with pytest.raises(httpx.ReadTimeout):  # and one leaves a non-streaming request
        httpx.post(url + "/v1/completions", timeout=1.0, json=LONG_BODY)
    t0 = time.time()
    r = client.completions.create(model="tiny", prompt="ab", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
    assert time.time() - t0 < 15, "the cancelled generation kept the worker busy"
    deadline = time.time() + 15  # batched, the short one may end before the leavers are seen
    while metric(after := httpx.get(url + "/metrics").text, "dflash2_in_flight"):
        assert time.time() < deadline, "a cancelled generation is still running"
        time.sleep(0.05)
    assert metric(after, "dflash2_cancelled_total") == metric(before, "dflash2_cancelled_total") + 2
    generated = metric(after, "dflash2_generated_tokens_total") - metric(
        before, "dflash2_generated_tokens_total"
    )
    assert generated < 2 * 4000  # not both ran to their end (the cancel count says both left)


def test_queue_bound_answers_503_with_retry_after(pair):
    """One at a time (max_batch=1): one generating, one waiting, the rest refused."""
    app = create_app(
        pair, model_name="tiny", max_queue=1, max_batch=1, context_length=None, default_max_tokens=2
    )
    with running(app) as base, httpx.Client(timeout=60) as http:
        cm, _lines = _open_long_stream(http, base)  # generating: 1 in flight
        results: list = [None] * 3

        def one(i):
            results[i] = httpx.post(
                base + "/v1/completions",
                timeout=60,
                json={"prompt": "q", "max_tokens": 2, "temperature": 0},
            )

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.time() + 20
        while sum(r is not None for r in results) < 2 and time.time() < deadline:
            time.sleep(0.02)
        busy = [r for r in results if r is not None]
        assert len(busy) == 2 and all(r.status_code == 503 for r in busy)
        for r in busy:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "queue_full"
        cm.__exit__(None, None, None)  # free the worker: the waiting request now runs
        for t in threads:
            t.join(60)
        assert sorted(r.status_code for r in results) == [200, 503, 503]
        text = httpx.get(base + "/metrics").text
    assert metric(text, "dflash2_requests_total", endpoint="/v1/completions", status="503") == 2


def test_count_tokens_takes_a_queue_place_while_it_tokenizes(pair):
    """Anthropic's count_tokens tokenizes up to a body's limit on the tokenizer thread that
    generations wait for: it holds a place there as they do, so a flood is a 503."""
    app = create_app(pair, model_name="tiny", max_queue=0, max_batch=1, default_max_tokens=2)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    with running(app) as base, httpx.Client(timeout=60) as http:
        count = base + "/v1/messages/count_tokens"
        assert http.post(count, json=body).json()["input_tokens"] > 0
        cm, _lines = _open_long_stream(http, base)  # the only place is taken
        r = http.post(count, json=body)
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error", r.text
        cm.__exit__(None, None, None)
        deadline = time.time() + 20
        while (r := http.post(count, json=body)).status_code == 503 and time.time() < deadline:
            time.sleep(0.05)  # the stream's place comes back once its job has left
        assert r.status_code == 200, r.text


def test_metrics_exposition(url):
    """The counters after this test's own requests (the module's other tests may run before
    or after it, even on a fresh server)."""
    chat = url + "/v1/chat/completions"
    for _ in range(2):
        assert httpx.post(chat, json={"messages": HI, "max_tokens": 4}).status_code == 200
    assert httpx.post(chat, json={"messages": HI, "n": 9}).status_code == 400
    assert httpx.post(chat, json={"messages": HI, "model": "nope"}).status_code == 404
    text = httpx.get(url + "/metrics").text
    for status, least in (("200", 2), ("400", 1), ("404", 1)):
        assert (
            metric(text, "dflash2_requests_total", endpoint="/v1/chat/completions", status=status)
            >= least
        )
    assert metric(text, "dflash2_generated_tokens_total") > 0
    assert metric(text, "dflash2_rounds_total") > 0
    assert (
        0
        <= metric(text, "dflash2_accepted_tokens_total")
        <= metric(text, "dflash2_drafted_tokens_total")
    )
    assert 1.0 <= metric(text, "dflash2_mean_acceptance_length") <= 4.0
    assert metric(text, "dflash2_queue_depth") == 0 and metric(text, "dflash2_in_flight") == 0
    assert "# TYPE dflash2_requests_total counter" in text
    assert re.search(r'^dflash2_info\{version="[^"]+",model="tiny"\} 1$', text, re.M)
    assert 0 < metric(text, "process_start_time_seconds") <= time.time()
    assert metric(text, "dflash2_prefill_seconds_count") >= 2  # one per generation
    assert metric(text, "dflash2_mlx_active_memory_bytes") > 0  # the weights at least
    assert metric(text, "dflash2_mlx_peak_memory_bytes") >= metric(
        text, "dflash2_mlx_active_memory_bytes"
    )
    assert metric(text, "dflash2_mlx_cache_memory_bytes") >= 0
    assert httpx.get(url + "/health").json()["status"] == "ok"  # still serving after all that


def test_an_idle_server_gives_mlx_buffer_cache_back(pair, monkeypatch):
    """MLX keeps freed buffers (a long prompt's prefill intermediates) for reuse: the
    process held its high-water mark for good; the worker clears them when it goes idle."""
    import mlx.core as mx

    cleared = []
    clear = mx.clear_cache
    monkeypatch.setattr(mx, "clear_cache", lambda: cleared.append(1) or clear())
    with running(create_app(pair, model_name="tiny", default_max_tokens=2)) as base:
        deadline = time.time() + 30
        while not cleared:  # idle from the start
            assert time.time() < deadline
            time.sleep(0.05)
        before = len(cleared)
        r = httpx.post(base + "/v1/completions", json={"prompt": "ab", "max_tokens": 2})
        assert r.status_code == 200
        while len(cleared) == before:  # and again once that request is done
            assert time.time() < deadline
            time.sleep(0.05)


def test_metrics_of_an_absent_prompt_cache_read_zero(pair):
    """--prompt-cache-mb 0: its series are there and read 0 (a dashboard's query of a series
    that vanished would say "no data", an alert on it never fire)."""
    with running(create_app(pair, model_name="tiny", prompt_cache_mb=0)) as base:
        text = httpx.get(base + "/metrics").text
    for name in ("hits_total", "misses_total", "entries", "bytes", "max_bytes"):
        assert re.search(rf"^dflash2_prompt_cache_{name} 0$", text, re.M), name


# ------------------------------------------------------------------ the command line
CLI = (
    "import sys\n"
    "from dflash2_cli import app as cli\n"
    "from dflash2_cli.serve import register\n"
    "if not any(c.name == 'serve' for c in cli.app.registered_commands):\n"
    "    register(cli.app)\n"
    "sys.exit(cli.run(sys.argv[1:]))\n"
)


def test_cli_serve_end_to_end(pair, tmp_path):
    """`serve --target DIR --drafter DIR` loads the saved pair and serves it; Ctrl-C exits
    cleanly; a usage mistake is one line and exit code 2."""
    import dataclasses
    import json
    import signal
    import sys

    from mlx_lm.utils import save_model

    from dflash2_mlx import save_drafter

    target, drafter = tmp_path / "target", tmp_path / "drafter"
    save_model(target, pair.model)
    args = {k: v for k, v in dataclasses.asdict(pair.model.args).items() if v is not None}
    args["max_position_embeddings"] = 4096  # the context it was "trained" for
    (target / "config.json").write_text(json.dumps(args))
    pair.tokenizer._tokenizer.save_pretrained(target)
    save_drafter(pair.drafter, drafter)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bad = subprocess.run(
        [sys.executable, "-c", CLI, "serve", "--target", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "needs --drafter" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            CLI,
            "serve",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--thinking",  # a model that never thinks (--no-thinking: what it does anyway)
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "no thinking switch" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "serve",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--port",
            str(port),
            "--context-length",
            "8192",  # past the tiny model's 4,096: served, with a note
            "--model-name",
            "tiny-cli",
            "--log-level",
            "warning",
            "--api-key",
            "unused",
            "--allowed-hosts",
            "box.lan",
            "--shutdown-grace",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, proc, 45)
        key = {"Authorization": "Bearer unused"}
        assert httpx.get(base + "/v1/models").status_code == 401
        assert httpx.get(base + "/v1/models", headers={**key, "Host": "box.lan"}).status_code == 200
        card = httpx.get(base + "/v1/models", headers=key).json()["data"][0]
        assert card["id"] == "tiny-cli" and card["dflash2"]["context_length"] == 8192
        assert card["dflash2"]["drafter"] == drafter.name  # a name, never a server path
        assert card["dflash2"]["target"] == target.name  # which copy of a model is served
        want, _ = reference(pair, chat_prompt_ids(pair.tokenizer, HI), 8)
        cli = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = cli.chat.completions.create(model="tiny-cli", messages=HI, max_tokens=8, temperature=0)
        assert r.choices[0].message.content == want
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, 130) and "Traceback" not in err, err  # 130: Ctrl-C
    assert "note: --context-length 8192 is past the model's own 4096 tokens" in err, err
