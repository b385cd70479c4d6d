"""Structured outputs through the server: `response_format` json_object / json_schema, on a
real uvicorn server on 127.0.0.1 with the official `openai` client (its `parse` helper sends a
strict json_schema from a pydantic model). The reply is the constrained generation the
library gives (exact), whole or streamed; schemas and combinations it cannot serve are a 400
naming the field."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Literal

import httpx
import openai
import pytest
import tiny
from pydantic import BaseModel
from test_constraint import CHARS, MOOD
from test_serve import make_tokenizer, running

from dflash2_mlx.api import Pair
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.grammar import Thinking
from dflash2_mlx.serve import create_app
from dflash2_mlx.serve.chat_prompt import ChatPrompt
from dflash2_mlx.serve.constrained import _calls, _thinking
from dflash2_mlx.serve.schemas import APIError, GenRequest
from dflash2_mlx.text import chat_prompt_ids

ASK = [{"role": "user", "content": "How are you? Answer in JSON."}]


class Mood(BaseModel):
    mood: Literal["happy", "sad", "calm"]
    ok: bool


@pytest.fixture(scope="module")
def pair():
    return Pair.from_models(
        tiny.make_target("llama", vocab=CHARS),
        make_tokenizer(CHARS),
        tiny.make_drafter(2, block_size=4, vocab=CHARS, mask_token_id=CHARS - 1),
    )


@pytest.fixture(scope="module")
def url(pair):
    app = create_app(pair, model_name="tiny", default_max_tokens=400, max_batch=2)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def constrained(pair, schema, max_tokens: int = 400) -> str:
    """The library's constrained greedy reply to ASK (its stop token dropped)."""
    ids = chat_prompt_ids(pair.tokenizer, ASK)
    params = GenerationParams(max_tokens=max_tokens, constraint=pair.json_schema(schema))
    out, _ = pair.generate(ids, params)
    return pair.tokenizer.decode([t for t in out if t not in pair.eos_ids])


def test_parse_with_a_pydantic_model(pair, client):
    done = client.chat.completions.parse(model="tiny", messages=ASK, response_format=Mood)
    choice = done.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Mood)
    strict = {**Mood.model_json_schema(), "additionalProperties": False}  # as the SDK sends it
    assert choice.message.content == constrained(pair, strict)


def test_json_object_streamed_equals_whole(pair, client):
    """Any JSON object (the random model's keys run long: cut at max_tokens here)."""
    kw = dict(model="tiny", messages=ASK, response_format={"type": "json_object"}, max_tokens=60)
    whole = client.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    assert text == constrained(pair, None, 60) and text.startswith("{")
    parts, finish = [], None
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == text and finish == whole.choices[0].finish_reason


def test_json_schema_requests_run_together(pair, url):
    """Two constrained requests with different schemas in one batch, each as alone."""
    import concurrent.futures

    flag = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}

    def ask(schema):
        body = {
            "messages": ASK,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        }
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(ask, [MOOD, flag]))
    assert got == [constrained(pair, MOOD), constrained(pair, flag)]
    assert {"mood", "ok"} == set(json.loads(got[0])) and set(json.loads(got[1])) <= {"ok"}


def _schema(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


BAD = [
    (_schema({"type": "strin"}), "response_format"),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}},
        "response_format.json_schema.schema",
    ),
    (
        {"type": "json_schema", "json_schema": {"name": "x", "format": 1}},
        "response_format.json_schema.format",
    ),
    ({"type": "json_object", "schema": {}}, "response_format.schema"),
    ({"type": "regex"}, "response_format.type"),
    ({"type": ["json_object"]}, "response_format.type"),
    ("json", "response_format"),
    (  # llguidance's "lenient" would let uniqueItems pass unenforced
        _schema({"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}}),
        "response_format.json_schema.schema.x-guidance",
    ),
]


@pytest.mark.parametrize("fmt,param", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_formats_it_cannot_serve_are_a_400_naming_the_field(url, fmt, param):
    r = httpx.post(url + "/v1/chat/completions", json={"messages": ASK, "response_format": fmt})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err


def test_text_format_is_free_text(pair, client):
    done = client.chat.completions.create(
        model="tiny", messages=ASK, response_format={"type": "text"}, max_tokens=12
    )
    out, _ = pair.generate(chat_prompt_ids(pair.tokenizer, ASK), GenerationParams(max_tokens=12))
    assert done.choices[0].message.content == pair.tokenizer.decode(out)
    assert done.choices[0].message.content != constrained(pair, None, 12)


def test_a_reply_that_starts_inside_a_thinking_section():
    """A template that opens the thinking section in the prompt: the reply's grammar starts
    inside it (free text to the end marker), then the value."""
    tok = SimpleNamespace(has_thinking=True, think_start="<think>", think_end="</think>")
    prompt = ChatPrompt([1], state="reasoning")
    assert _thinking(tok, prompt) == Thinking("<think>", "</think>", opened=True)


def test_thinking_turned_off_leaves_no_thinking_section_to_the_reply(tmp_path):
    """Thinking on: the reply may open a section before the value; off (the template wrote an
    empty one into the reply's turn): it may not; a closed section in an earlier turn of the
    history does not count."""
    import tiny_tools as tt

    tok = tt.load_tokenizer(tt.save_tokenizer(tmp_path / "tok"))
    on = chat_prompt_ids(tok, tt.HI, template_kwargs={"enable_thinking": True})
    off = chat_prompt_ids(tok, tt.HI, template_kwargs={"enable_thinking": False})
    assert _thinking(tok, ChatPrompt(on)) == Thinking("<think>", "</think>")
    assert _thinking(tok, ChatPrompt(off)) is None
    earlier = tt.HI + [{"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello!"}]
    later = chat_prompt_ids(tok, earlier + tt.HI, template_kwargs={"enable_thinking": True})
    assert _thinking(tok, ChatPrompt(later)) == Thinking("<think>", "</think>")


def test_strict_tools_need_a_call_format_the_grammar_knows():
    """A tool-call format other than json_tools (here a stand-in parser from another module):
    strict tools are refused naming the tool's strict field, not silently loosened."""
    from dflash2_mlx.serve.tools import ToolRequest

    fn = {"name": "f", "parameters": {"type": "object"}}
    tools = ToolRequest(({"type": "function", "function": fn},), strict=frozenset({"f"}))
    tok = SimpleNamespace(tool_parser=json.loads, tool_call_start="[", tool_call_end="]")
    pair = SimpleNamespace(tokenizer=tok)
    with pytest.raises(APIError) as err:
        _calls(pair, GenRequest("chat", None, {}), tools, ChatPrompt([1]))
    assert err.value.param == "tools[0].function.strict" and "json_tools" in err.value.message


def test_logprobs_of_a_constrained_reply_are_finite(pair, url):
    """Tokens the schema forbids come out as OpenAI writes impossible ones (-9999), never as
    -inf (not JSON), whole and streamed."""
    body = {
        "messages": ASK,
        "response_format": {"type": "json_schema", "json_schema": {"name": "m", "schema": MOOD}},
        "logprobs": True,
        "top_logprobs": 5,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    entries = r.json()["choices"][0]["logprobs"]["content"]
    values = [a["logprob"] for e in entries for a in e["top_logprobs"]]
    assert min(values) == -9999.0  # a forced position: one token allowed, the rest impossible
    assert all(e["logprob"] > -9999.0 for e in entries)
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: {")]
    assert lines and not any("Infinity" in line or "NaN" in line for line in lines)
    streamed = [json.loads(line[6:]) for line in lines]
    tokens = [
        e["token"] for c in streamed for e in (c["choices"][0]["logprobs"] or {}).get("content", [])
    ]
    assert "".join(tokens) == r.json()["choices"][0]["message"]["content"]


def test_a_closed_section_with_a_marker_of_several_tokens():
    """The end marker's own tokens are not turn markers after it (here its last token is a
    special token): an empty section the template closed is still seen as closed."""
    from dflash2_mlx.serve.reasoning import closes_thinking

    class Tok:
        has_thinking, think_end_tokens, all_special_ids, eos_token_ids = True, [7, 8], [8, 9], [9]

        def rfind_think_start(self, ids):
            return max((i for i, t in enumerate(ids) if t == 6), default=-1)

        def rfind_think_end(self, ids):
            return max((i for i in range(len(ids) - 1) if ids[i : i + 2] == [7, 8]), default=-1)

    assert closes_thinking(Tok(), [9, 1, 6, 7, 8, 2])  # the reply's turn: closed by the template
    assert not closes_thinking(Tok(), [6, 7, 8, 9, 1])  # an earlier turn's, ended by eos 9
    assert not closes_thinking(Tok(), [1, 6, 3])  # open


def test_a_section_opened_by_a_special_marker_is_open():
    """The reply's own turn opens the section with a marker that is itself a special token:
    open (only a turn mark after it closes the turn); one a message quoted is not."""
    from dflash2_mlx.chat_template import thinking_left_open

    class Tok:
        has_thinking, think_start_tokens, think_end_tokens = True, [6], [7]
        all_special_ids, eos_token_ids = [6, 9], [9]

        def rfind_think_start(self, ids):
            return max((i for i, t in enumerate(ids) if t == 6), default=-1)

        def rfind_think_end(self, ids):
            return max((i for i, t in enumerate(ids) if t == 7), default=-1)

    assert thinking_left_open(Tok(), [1, 5, 9, 1, 6])  # the generation prompt opens it
    assert thinking_left_open(Tok(), [1, 5, 9, 1, 6, 3, 4])  # a continued final message
    assert not thinking_left_open(Tok(), [1, 6, 5, 9, 1])  # a message's, its turn ended
    assert not thinking_left_open(Tok(), [1, 6, 3, 7, 2])  # closed


def test_a_schema_beyond_the_grammar_engine_is_a_400_whole_and_an_error_event_streamed(url):
    """A pattern llguidance compiles but cannot follow past a few tokens (a{100000}: "too many
    expressions constructed" mid-reply) is the client's schema's limit, not a server fault:
    a 400 saying so (it was a 500 with the parser's state in the log)."""
    a = {"type": "string", "pattern": "^a{100000}$"}
    schema = {"type": "object", "properties": {"a": a}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = {"messages": ASK, "max_tokens": 200, "response_format": fmt}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert "beyond what the grammar engine can follow" in r.json()["error"]["message"]
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as s:
        events = [line for line in s.iter_lines() if line.startswith("data: {")]
    assert "beyond what the grammar engine" in events[-1] and '"error"' in events[-1]


def test_a_schema_with_no_complete_value_is_an_error_not_a_finished_reply(url):
    """llguidance allows the stop token where a value cannot go on ($ref cycles with no base
    case): the cut JSON used to come back with finish_reason "stop". A schema sure to admit no
    finite value is refused up front (schema_ends.check_can_end); one it is unsure of (an $id
    scopes its refs) and that gets stuck midway ends the reply with an error."""
    cycle = {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}
    stuck_at_once = {"$ref": "#/$defs/A", **cycle}
    props = {"x": {"$ref": "#/$defs/A"}, "y": {"$id": "urn:example:y", "type": "string"}}
    midway = {"type": "object", "properties": props, "required": ["x"]}
    for schema, needle in (
        (stuck_at_once, "value satisfies it"),
        ({**midway, "properties": props | {"y": {"type": "string"}}, **cycle}, "satisfies it"),
        ({**midway, **cycle}, "admits no complete value"),
    ):
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        body = {"messages": ASK, "max_tokens": 40, "response_format": fmt}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as s:
        events = [line for line in s.iter_lines() if line.startswith("data: {")]
    assert "admits no complete value" in events[-1] and '"error"' in events[-1]
    assert not any('"finish_reason":"stop"' in e.replace(" ", "") for e in events)
    # Responses: the `error` event, then the terminal `response.failed` stream consumers
    # wait on (the stream just ended after the error)
    fmt = {"format": {"type": "json_schema", "name": "x", "schema": {**midway, **cycle}}}
    body = {"input": ASK, "max_output_tokens": 40, "text": fmt, "stream": True}
    with httpx.stream("POST", url + "/v1/responses", json=body) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and "admits no complete value" in failed["error"]["message"]


def test_a_schema_of_many_patterns_at_once_is_a_fast_400_and_the_server_goes_on(url, client):
    """allOf of 200 search patterns (a ~2 KB body): llguidance would take minutes and
    gigabytes to check them, on the thread every prompt waits behind. It is refused before
    compiling; 8 at once are llguidance's to judge, and any number apart or as alternatives
    compile."""
    import time

    def pattern(i):
        return {"type": "string", "pattern": f".*{i}.*"}

    def post(schema, max_tokens=4):
        body = {"messages": ASK, "max_tokens": max_tokens, "response_format": _schema(schema)}
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)

    started = time.monotonic()
    r = post({"allOf": [pattern(i) for i in range(200)]})
    assert r.status_code == 400 and time.monotonic() - started < 10, r.text
    assert "200 patterns or formats at once" in r.json()["error"]["message"]
    defs = {f"d{i}": pattern(i) for i in range(9)}  # through $refs and properties alike
    hidden = {"$defs": defs, "allOf": [{"$ref": f"#/$defs/d{i}"} for i in range(9)]}
    assert post(hidden).status_code == 400
    deep = {"allOf": [{"type": "object", "properties": {"a": pattern(i)}} for i in range(9)]}
    assert post(deep).status_code == 400
    inner = {"properties": {"b": {"allOf": [pattern(i) for i in range(19)]}}}  # a JSON pointer
    pointed = {"$defs": {"A": inner}, "properties": {"x": {"$ref": "#/$defs/A/properties/b"}}}
    assert post(pointed).status_code == 400
    some = {"allOf": [pattern(i) for i in range(5)]}  # 5 + 5 on one key: additionalProperties
    merged = {"allOf": [{"properties": {"a": some}}, {"additionalProperties": some}]}
    assert post(merged).status_code == 400
    eight = post({"allOf": [pattern(i) for i in range(8)]})  # llguidance's to judge (fast)
    assert "at once" not in eight.text and time.monotonic() - started < 20
    for fine in (
        {"allOf": [pattern(1), {"type": "string", "pattern": "^a"}]},
        {"anyOf": [pattern(i) for i in range(30)]},
        {"type": "object", "properties": {f"k{i}": pattern(i) for i in range(30)}},
    ):
        assert post(fine).status_code == 200, post(fine).text
    assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4).choices
