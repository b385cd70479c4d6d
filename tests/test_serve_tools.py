"""`dflash2 serve` for agents: tool calls and the reasoning split, with a tiny target trained in
the session to really call a tool and to think (tests/tiny_tools.py), a real uvicorn server on
127.0.0.1 and the official openai client. The calls are parsed by mlx-lm's tool parser (the
one mlx-lm infers from the template); the answers are the target's greedy ones."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import tiny
import tiny_tools as tt
from test_serve import metric, running

from dflash2_mlx.api import Pair
from dflash2_mlx.engine.events import RoundEvent
from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.serve import create_app
from dflash2_mlx.serve.api_error import APIError
from dflash2_mlx.serve.chat_prompt import ChatPrompt, ChatTemplate
from dflash2_mlx.serve.reply import ChatReply
from dflash2_mlx.serve.tools import ToolRequest, parse_tools
from dflash2_mlx.text import chat_prompt_ids

WEATHER_CHOICE = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="session")
def tool_pair(tmp_path_factory):
    return tt.trained_pair(tmp_path_factory.mktemp("tiny-tools"))


@pytest.fixture(scope="session")
def tool_tokenizer(tmp_path_factory):
    return tt.load_tokenizer(tt.save_tokenizer(tmp_path_factory.mktemp("tiny-tools-tok")))


@pytest.fixture(scope="module")
def tool_url(tool_pair):
    app = create_app(tool_pair, model_name="tools", default_max_tokens=64, context_length=1024)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(tool_url):
    return openai.OpenAI(base_url=tool_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client, messages, **kw):
    kw.setdefault("max_tokens", 64)
    return client.chat.completions.create(model="tools", messages=messages, temperature=0, **kw)


def streamed(client, messages, **kw):
    """Stream a reply and put it back together as a client does: content, reasoning_content
    (also sent as `reasoning`, mlx_lm.server's name: the same text), and tool calls by index
    (id, type and name once, arguments concatenated)."""
    content, reasoning, also, calls, finish, usage = "", "", "", {}, None, None
    for chunk in ask(client, messages, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        also += (delta.model_extra or {}).get("reasoning") or ""
        for tc in delta.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = tc.id or call["id"]
            if tc.function is not None:
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    assert also == reasoning
    return content, reasoning, [calls[i] for i in sorted(calls)], finish, usage


def weather_calls(calls) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


# ------------------------------------------------------------------ tool calls
def test_tool_round_trip(client):
    r = ask(client, tt.ASK, tools=tt.TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert weather_calls(choice.message.tool_calls) == [("get_weather", tt.CALL_ARGS)]
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert r.usage.model_extra["dflash2"]["tool_calls"] == 1
    # The agent runs the tool and sends the assistant message back as it came, plus the result.
    history = tt.ASK + [
        choice.message,
        {"role": "tool", "tool_call_id": call.id, "content": tt.RESULT},
    ]
    final = ask(client, history, tools=tt.TOOLS)
    assert final.choices[0].message.content == tt.FINAL
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.tool_calls is None
    assert final.usage.model_extra["dflash2"]["tool_calls"] == 0


def strict(tool: dict, **params) -> dict:
    """`tool` as the OpenAI Agents SDK sends it (strict: true), its parameters updated."""
    fn = tool["function"]
    return {
        "type": "function",
        "function": {**fn, "strict": True, "parameters": {**fn["parameters"], **params}},
    }


def test_strict_tools_hold_the_arguments_to_their_schema(client):
    """strict: true (the Agents SDK's default): a valid call comes out as without it; where
    the model's arguments break the schema, the grammar holds them to it."""
    loose = ask(client, tt.ASK, tools=tt.TOOLS)
    held = ask(client, tt.ASK, tools=[strict(tt.WEATHER)])
    assert weather_calls(held.choices[0].message.tool_calls) == [("get_weather", tt.CALL_ARGS)]
    assert held.choices[0].message.tool_calls[0].function.arguments == (
        loose.choices[0].message.tool_calls[0].function.arguments
    )
    assert held.choices[0].finish_reason == "tool_calls"
    other = {"city": {"enum": ["rome"]}}  # the model asks for paris
    forced = ask(client, tt.ASK, tools=[strict(tt.WEATHER, properties=other)])
    calls = weather_calls(forced.choices[0].message.tool_calls)
    assert calls and all(c == ("get_weather", {"city": "rome"}) for c in calls)  # diverted
    usage = forced.usage.model_extra["dflash2"]
    assert usage["tool_calls"] == len(calls) and usage["rounds"] >= 1


def test_strict_tools_past_the_grammar_engine_and_past_the_context(tool_pair):
    """700 strict tools and a forced choice pass llguidance's parser limit: a 400 saying so
    (it said the call's opening was refused, and to use "auto"); the same past the context is
    context_length_exceeded, found before any grammar is compiled."""
    many = [strict({"function": {**tt.WEATHER["function"], "name": f"t{i}"}}) for i in range(700)]
    body = {"messages": tt.HI, "max_tokens": 1, "tools": many, "tool_choice": "required"}
    for context, code in ((400_000, "invalid_value"), (1024, "context_length_exceeded")):
        app = create_app(tool_pair, model_name="tools", context_length=context)
        with running(app) as base:
            err = httpx.post(base + "/v1/chat/completions", json=body, timeout=120).json()["error"]
        assert err["code"] == code, err
        if code == "invalid_value":
            assert err["param"] == "tools" and "beyond what the grammar engine" in err["message"]
            assert "Current row has" in err["message"] and "opening" not in err["message"]


def test_a_schema_reply_beside_tools(client):
    """response_format with tools (auto): the reply calls a tool as without the schema, or
    answers with a value the schema accepts."""
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": OK_SCHEMA}}
    call = ask(client, tt.ASK, tools=tt.TOOLS, response_format=fmt)
    assert weather_calls(call.choices[0].message.tool_calls) == [("get_weather", tt.CALL_ARGS)]
    # untrained with tools in its prompt, the model may do either; either way it follows
    # the grammar: parsed calls with object arguments, or the schema's value
    other = ask(client, tt.HI, tools=tt.TOOLS, response_format=fmt, max_tokens=120)
    msg = other.choices[0].message
    if msg.tool_calls:
        assert other.choices[0].finish_reason == "tool_calls"
        assert all(isinstance(args, dict) for _, args in weather_calls(msg.tool_calls))
    else:
        assert isinstance(json.loads(msg.content)["ok"], bool)


def test_tool_round_trip_streaming(client):
    content, reasoning, calls, finish, usage = streamed(client, tt.ASK, tools=tt.TOOLS)
    assert (content, reasoning, finish) == ("", "", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", tt.CALL_ARGS)
    ]
    assert calls[0]["id"].startswith("call_") and usage.model_extra["dflash2"]["tool_calls"] == 1
    # The SDK's own accumulator (client.chat.completions.stream) reads the same call.
    with client.chat.completions.stream(
        model="tools", messages=tt.ASK, tools=tt.TOOLS, temperature=0, max_tokens=64
    ) as s:
        final = s.get_final_completion()
    assert weather_calls(final.choices[0].message.tool_calls) == [("get_weather", tt.CALL_ARGS)]
    assert final.choices[0].message.content is None  # as the whole reply has it
    history = tt.ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": tt.RESULT},
    ]
    content, _, calls, finish, _ = streamed(client, history, tools=tt.TOOLS)
    assert (content, calls, finish) == (tt.FINAL, [], "stop")


def test_parallel_calls_and_parallel_tool_calls_false(client):
    r = ask(client, tt.ASK_TWO, tools=tt.TOOLS)
    assert weather_calls(r.choices[0].message.tool_calls) == [
        ("get_weather", {"city": "paris"}),
        ("get_weather", {"city": "rome"}),
    ]
    # the template's "\n" between the calls is no answer: no content, whole or streamed
    assert r.choices[0].message.content is None
    content, _, calls, finish, _ = streamed(client, tt.ASK_TWO, tools=tt.TOOLS)
    assert (content, len(calls), finish) == ("", 2, "tool_calls")
    one = ask(client, tt.ASK_TWO, tools=tt.TOOLS, parallel_tool_calls=False)
    assert one.choices[0].finish_reason == "tool_calls"
    assert weather_calls(one.choices[0].message.tool_calls) == [("get_weather", {"city": "paris"})]
    _, _, calls, finish, _ = streamed(client, tt.ASK_TWO, tools=tt.TOOLS, parallel_tool_calls=False)
    assert [c["name"] for c in calls] == ["get_weather"] and finish == "tool_calls"


def test_a_prefill_that_opens_a_call_is_answered_with_the_call(client, tool_url):
    """A final assistant message that opens a tool call (its start marker, maybe some of its
    JSON): the reply goes on inside the call, which comes back as tool_calls (strict: held to
    the schema from there), not as text; Anthropic's prefill likewise gives a tool_use."""
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    for opening in ("<tool_call>\n", '<tool_call>\n{"name": "get_weather"'):
        prefilled = tt.ASK + [{"role": "assistant", "content": opening}]
        for tools in (tt.TOOLS, [strict(tt.WEATHER)]):
            r = ask(client, prefilled, tools=tools, extra_body=extra)
            choice = r.choices[0]
            assert weather_calls(choice.message.tool_calls) == [("get_weather", tt.CALL_ARGS)]
            assert choice.message.content is None and choice.finish_reason == "tool_calls"
            content, _, calls, finish, _ = streamed(
                client, prefilled, tools=tools, extra_body=extra
            )
            assert (content, finish) == ("", "tool_calls")
            assert [(c["name"], json.loads(c["arguments"])) for c in calls] == weather_calls(
                choice.message.tool_calls
            )
    assert ask(client, prefilled, extra_body=extra).choices[0].message.tool_calls is None
    body = {
        "model": "tools",
        "max_tokens": 64,
        "messages": tt.ASK + [{"role": "assistant", "content": "<tool_call>"}],
        "tools": [
            {
                "name": "get_weather",
                "input_schema": tt.WEATHER["function"]["parameters"],
                "strict": True,  # "<tool_call>" without its newline: the tiny model needs help
            }
        ],
        "thinking": {"type": "disabled"},
    }
    r = httpx.post(tool_url + "/v1/messages", json=body).json()
    assert r.get("stop_reason") == "tool_use", str(r)
    blocks = {(b["type"], tuple(sorted(b.get("input", {})))) for b in r["content"]}
    assert blocks == {("tool_use", ("city",))}, r  # one call or more, no text


def test_a_prefilled_call_a_strict_tool_cannot_take_names_the_message(tool_url):
    """A prefill that opens a call to no listed tool, under a strict tool: the 400 names the
    final assistant message (the client sent no forced tool_choice to blame)."""
    body = {
        "messages": tt.ASK + [{"role": "assistant", "content": '<tool_call>\n{"name": "nope"'}],
        "tools": [strict(tt.WEATHER)],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    r = httpx.post(tool_url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "the final assistant message opens" in err["message"]


def test_a_stream_held_on_a_long_call_keeps_the_connection_alive(tool_pair, monkeypatch):
    """A call's text is sent when its end marker comes; meanwhile (a file written through a
    tool call runs for minutes) the stream sends keep-alive comments, as before the first
    token, so clients and proxies do not time out on a silent connection. Each forward is
    made to outlast keepalive_s (a fast machine's whole reply came without a gap)."""
    from dflash2_mlx.serve import ServeLimits

    adapter = tool_pair.decoder.target
    forward = adapter.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.06)
        return forward(*args, **kwargs)

    monkeypatch.setattr(adapter, "forward", slow_forward)  # this pair's alone, for this test

    quote = tool_pair.tokenizer.encode('"', add_special_tokens=False)
    body = {
        "model": "tools",
        "messages": tt.ASK,
        "tools": [strict(tt.WEATHER)],
        "tool_choice": "required",
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "logit_bias": {str(t): -100 for t in quote},  # the argument's string never closes
    }
    app = create_app(tool_pair, model_name="tools", limits=ServeLimits(keepalive_s=0.05))
    with running(app) as base, httpx.stream("POST", base + "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    first = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert ": keep-alive" in lines[first:], lines
    assert lines[-1] == "data: [DONE]"


def test_tool_choice_required_named_and_none(tool_pair, client):
    auto = ask(client, tt.ASK, tools=tt.TOOLS)
    for choice in ("required", WEATHER_CHOICE):
        r = ask(client, tt.ASK, tools=tt.TOOLS, tool_choice=choice)
        assert r.choices[0].finish_reason == "tool_calls", choice
        assert weather_calls(r.choices[0].message.tool_calls) == [("get_weather", tt.CALL_ARGS)]
        # the opening of the call is prefilled: part of the prompt, not of the completion
        assert r.usage.prompt_tokens > auto.usage.prompt_tokens
        assert r.usage.completion_tokens < auto.usage.completion_tokens
        _, _, calls, finish, _ = streamed(client, tt.ASK, tools=tt.TOOLS, tool_choice=choice)
        assert [c["name"] for c in calls] == ["get_weather"] and finish == "tool_calls"
        # strict: the forced call goes on from its opening, held to the schema
        held = ask(client, tt.ASK, tools=[strict(tt.WEATHER)], tool_choice=choice)
        assert weather_calls(held.choices[0].message.tool_calls) == [("get_weather", tt.CALL_ARGS)]
        other = {"city": {"enum": ["rome"]}}
        held = ask(client, tt.ASK, tools=[strict(tt.WEATHER, properties=other)], tool_choice=choice)
        calls = weather_calls(held.choices[0].message.tool_calls)
        assert calls and all(c == ("get_weather", {"city": "rome"}) for c in calls), choice
    none = ask(client, tt.ASK, tools=tt.TOOLS, tool_choice="none")
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].finish_reason in ("stop", "length")
    # "none": the tools are left out of the prompt
    assert none.usage.prompt_tokens == len(chat_prompt_ids(tool_pair.tokenizer, tt.ASK))


def test_a_forced_strict_call_the_grammar_cannot_follow_is_a_short_400(client):
    """A tool name the tiny tokenizer cannot spell (<unk>): the call the prompt opens is not
    one the grammar allows. The 400 names tool_choice in one sentence, without the grammar
    parser's state (it once carried llguidance's whole dump)."""
    unknown = {"type": "function", "function": {**tt.WEATHER["function"], "name": "get_time"}}
    choice = {"type": "function", "function": {"name": "get_time"}}
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, tt.ASK, tools=[strict(unknown)], tool_choice=choice)
    err = e.value.body
    assert err["param"] == "tool_choice" and "grammar of the strict tool's call" in err["message"]
    assert "\n" not in err["message"] and len(err["message"]) < 300


SKY = {
    "type": "function",
    "function": {"name": "get_sky", "description": "the sky", "parameters": {"type": "object"}},
}


def test_tool_choice_required_calls_a_listed_tool_without_strict(client):
    """A forced tool_choice holds the call to a listed tool with an object of arguments,
    strict or not: the target, trained to call get_weather, must call get_sky here (before:
    a call named get_weather, which the request never listed)."""
    kw = dict(tools=[SKY], tool_choice="required", parallel_tool_calls=False)
    r = ask(client, tt.ASK, **kw)
    calls = weather_calls(r.choices[0].message.tool_calls or [])
    assert len(calls) == 1 and calls[0][0] == "get_sky" and isinstance(calls[0][1], dict)
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    content, _, streamed_calls, finish, _ = streamed(client, tt.ASK, **kw)
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed_calls] == calls
    assert finish == "tool_calls" and not content


def test_a_forced_tool_choice_holds_loose_tools_to_their_schema_where_it_can(client):
    """tool_choice "required" or a named function: the call's arguments follow the tool's
    schema, strict or not (a small model copied the schema itself into them); "auto" leaves a
    loose tool's alone; a schema no grammar can hold goes unheld, answered, not a 400."""
    fn = tt.WEATHER["function"]
    rome = {
        "type": "function",
        "function": {
            **fn,
            "parameters": {**fn["parameters"], "properties": {"city": {"enum": ["rome"]}}},
        },
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        r = ask(client, tt.ASK, tools=[rome], tool_choice=choice, parallel_tool_calls=False)
        assert weather_calls(r.choices[0].message.tool_calls) == [("get_weather", {"city": "rome"})]
        assert r.choices[0].finish_reason == "tool_calls"
    auto = ask(client, tt.ASK, tools=[rome])  # the model asks for paris, unheld
    assert weather_calls(auto.choices[0].message.tool_calls)[0] == ("get_weather", tt.CALL_ARGS)
    broken = {
        "type": "function",
        "function": {
            **fn,
            "parameters": {"type": "object", "properties": {"x": {"$ref": "#/nope"}}},
        },
    }
    r = ask(client, tt.ASK, tools=[broken], tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].finish_reason in ("tool_calls", "length", "stop")


def test_a_forced_call_with_a_response_format_is_the_call(client):
    """A forced tool_choice's reply is a call, with no text for response_format to hold:
    both together (instructor's RESPONSES_TOOLS sends them on every call) were a 400; the
    reply is the call it is without the format, on both endpoints."""
    kw = dict(tools=[SKY], tool_choice="required", parallel_tool_calls=False)
    plain = ask(client, tt.ASK, **kw)
    fmt = {"type": "json_schema", "json_schema": {"name": "sky", "schema": {"type": "object"}}}
    both = ask(client, tt.ASK, response_format=fmt, **kw)
    assert weather_calls(both.choices[0].message.tool_calls) == weather_calls(
        plain.choices[0].message.tool_calls
    )
    assert both.choices[0].finish_reason == "tool_calls"
    kw = dict(
        model="tools",
        input=tt.ASK,
        tools=[{"type": "function", **SKY["function"]}],
        tool_choice={"type": "function", "name": "get_sky"},
        temperature=0,
        max_output_tokens=200,
    )
    text = {"format": {"type": "json_schema", "name": "sky", "schema": {"type": "object"}}}
    plain, both = client.responses.create(**kw), client.responses.create(text=text, **kw)
    # (this tiny model's get_sky arguments do not parse on this prompt: text, either way)
    assert [o.type for o in both.output] == [o.type for o in plain.output]
    assert both.output_text == plain.output_text and both.output_text


# ------------------------------------------------------------------ reasoning
def thought_tokens(tokenizer) -> int:
    return len(tokenizer.encode(f"<think>\n{tt.THOUGHT}\n</think>", add_special_tokens=False))


def test_reasoning_split(tool_pair, client):
    r = ask(client, tt.HI)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"].strip() == tt.THOUGHT
    assert msg.model_extra["reasoning"] == msg.model_extra["reasoning_content"]
    assert msg.content.strip() == tt.ANSWER and "<think>" not in msg.content
    assert r.usage.completion_tokens_details.reasoning_tokens == thought_tokens(tool_pair.tokenizer)
    thinking = r.usage.model_extra["dflash2"]["reasoning"]
    assert thinking["tokens"] == r.usage.completion_tokens_details.reasoning_tokens
    assert thinking["rounds"] >= 1 and thinking["drafted"] > 0  # speculation ran in there
    assert thinking["rounds"] <= r.usage.model_extra["dflash2"]["rounds"]
    content, reasoning, calls, finish, usage = streamed(client, tt.HI)
    assert (content, reasoning, calls, finish) == (
        msg.content,
        msg.model_extra["reasoning_content"],
        [],
        "stop",
    )
    assert usage.completion_tokens_details.reasoning_tokens == thought_tokens(tool_pair.tokenizer)
    # the client may send the reasoning back with the assistant turn
    history = tt.HI + [msg, {"role": "user", "content": "hi"}]
    assert "reasoning_content" in msg.model_dump()
    assert ask(client, history, max_tokens=2).usage.completion_tokens >= 1


OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def test_a_schema_reply_after_thinking(tool_pair, client):
    """response_format on a model that thinks: it thinks as it does without one, then writes
    the value (reasoning_content and content split as usual); streamed alike."""
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": OK_SCHEMA}}
    r = ask(client, tt.HI, response_format=fmt, max_tokens=120)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"].strip() == tt.THOUGHT
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(msg.content)["ok"], bool)
    content, reasoning, _, finish, _ = streamed(client, tt.HI, response_format=fmt, max_tokens=120)
    assert (content, reasoning, finish) == (
        msg.content,
        msg.model_extra["reasoning_content"],
        "stop",
    )


def test_thinking_switch_per_request_and_server_default(tool_pair, client):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    r = ask(client, tt.HI, extra_body=off)
    assert r.choices[0].message.content == tt.SHORT_ANSWER
    assert not {"reasoning_content", "reasoning"} & set(r.choices[0].message.model_extra)
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    content, reasoning, _, _, _ = streamed(client, tt.HI, extra_body=off)
    assert (content, reasoning) == (tt.SHORT_ANSWER, "")
    app = create_app(tool_pair, model_name="tools", default_max_tokens=64, thinking=False)
    with running(app) as base:
        quiet = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        assert ask(quiet, tt.HI).choices[0].message.content == tt.SHORT_ANSWER
        on = ask(quiet, tt.HI, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert on.choices[0].message.model_extra["reasoning_content"].strip() == tt.THOUGHT
        assert httpx.get(base + "/v1/models").json()["data"][0]["dflash2"]["thinking"] is False


def test_metrics_count_tool_calls_and_reasoning(tool_url, client):
    before = httpx.get(tool_url + "/metrics").text
    ask(client, tt.ASK_TWO, tools=tt.TOOLS)
    ask(client, tt.HI)
    after = httpx.get(tool_url + "/metrics").text

    def grew(name):
        return metric(after, name) - metric(before, name)

    assert grew("dflash2_tool_calls_total") == 2
    assert grew("dflash2_reasoning_tokens_total") > 0 and grew("dflash2_reasoning_rounds_total") > 0
    assert httpx.get(tool_url + "/v1/models").json()["data"][0]["dflash2"]["tool_calling"] is True


# ------------------------------------------------------------------ bad input
ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{bad"}}
    ],
}


def answered_call(arguments: str, answers: str) -> dict:
    """A body whose history holds a get_weather call and a tool message answering `answers`."""
    call = {
        **ASSISTANT_CALL["tool_calls"][0],
        "function": {"name": "get_weather", "arguments": arguments},
    }
    return {
        "messages": tt.ASK
        + [
            {**ASSISTANT_CALL, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": answers, "content": "x"},
        ]
    }


@pytest.mark.parametrize("arguments", ["{bad", "[1, 2]", '"paris"'])
def test_history_arguments_that_are_no_json_object_reach_the_template_as_text(
    tool_pair, client, arguments
):
    """A past call's arguments are opaque to the API (one cut short, another provider's): the
    conversation goes on, the template rendering the string as it is."""
    body = answered_call(arguments, "c1")["messages"]
    r = ask(client, body, tools=tt.TOOLS, max_tokens=4)
    call = {**ASSISTANT_CALL["tool_calls"][0], "function": {"name": "get_weather"}}
    call["function"]["arguments"] = arguments
    rendered = [*body[:1], {**body[1], "content": "", "tool_calls": [call]}, body[2]]
    want = chat_prompt_ids(tool_pair.tokenizer, rendered, tools=tt.TOOLS)
    assert r.usage.prompt_tokens == len(want)


def test_a_null_tool_result_and_the_reasoning_field_of_vllm_are_taken(client):
    """Clients send an empty tool output as null, and OpenRouter / vLLM history carries a
    turn's thinking as `reasoning`: both were 400s; they read as "" and reasoning_content."""
    body = answered_call('{"city": "Paris"}', ASSISTANT_CALL["tool_calls"][0]["id"])["messages"]

    def with_(tool: dict, assistant: dict):
        return [*body[:-2], {**body[-2], **assistant}, {**body[-1], **tool}]

    null, empty = (with_({"content": c}, {}) for c in (None, ""))
    a, b = (ask(client, m, tools=tt.TOOLS, max_tokens=4) for m in (null, empty))
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    assert a.choices[0].message.content == b.choices[0].message.content
    think = "the user asks for the weather"
    named = [with_({}, {k: think}) for k in ("reasoning", "reasoning_content")]
    c, d = (ask(client, m, tools=tt.TOOLS, max_tokens=4) for m in named)
    assert c.usage.prompt_tokens == d.usage.prompt_tokens
    assert c.choices[0].message.content == d.choices[0].message.content


def test_a_stop_string_never_cuts_into_a_marker(tool_pair):
    """A stop "i" once matched inside "<think>" and left "<th" as the reply's content; a
    stop may still be a whole marker."""
    from dflash2_mlx.text import TextStream

    text = f"<think>\n{tt.THOUGHT}\n</think>\n\n{tt.ANSWER}"
    ids = tool_pair.tokenizer.encode(text, add_special_tokens=False)
    thought = text.index(tt.THOUGHT)
    for stops, want in (
        (["i"], text[: text.index("i", thought)]),  # the first "i" outside the markers
        (["k>"], text),  # only ever inside one: no match
        (["<think>"], ""),
        (["</think>"], text[: text.index("</think>")]),
    ):
        whole = TextStream(tool_pair.tokenizer, stops)
        assert whole.feed(ids, final=True)[0] == want, stops
        one, got = TextStream(tool_pair.tokenizer, stops), ""
        for t in ids:  # a token a round: the same cut
            part, hit = one.feed([t], final=False)
            got += part
            if hit:
                break
        assert got == want, stops


FN = {"name": "f", "parameters": {"type": "object", "properties": {}}}
FN_ARGS_5 = {"name": "get_weather", "arguments": 5}
BAD = [
    ({"tools": "get_weather"}, "tools"),
    (  # arguments that are not a string
        {"messages": tt.ASK + [{**ASSISTANT_CALL, "tool_calls": [{"function": FN_ARGS_5}]}]},
        "messages[1].tool_calls[0].function.arguments",
    ),
    ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    (
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"properties": [1]}}}
            ]
        },
        "tools[0].function.parameters.properties",
    ),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "two words"}}]},
        "tools[0].function.name",
    ),
    (
        {"tools": [{"type": "function", "function": {**FN, "parameters": "x"}}]},
        "tools[0].function.parameters",
    ),
    (
        {"tools": [{"type": "function", "function": {**FN, "strict": "yes"}}]},
        "tools[0].function.strict",
    ),
    (
        {"tools": [strict(tt.WEATHER, properties={"city": {"type": "strin"}})]},
        "tools[0].function.parameters",
    ),
    (
        {"tools": [strict(tt.WEATHER, properties={"city": {"$ref": "#"}})]},
        "tools[0].function.parameters",
    ),
    (
        {"tools": [{"type": "function", "function": {**FN, "examples": []}}]},
        "tools[0].function.examples",
    ),
    ({"tools": [tt.WEATHER, tt.WEATHER]}, "tools[1].function.name"),
    ({"tools": tt.TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": tt.TOOLS, "tool_choice": {"type": "allowed_tools"}}, "tool_choice.type"),
    (
        {"tools": tt.TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": tt.TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"messages": tt.ASK + [{"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
    (
        {
            "messages": [
                {"role": "user", "content": "x", "tool_calls": []},
                {"role": "user", "content": "x", "tool_call_id": "c1"},
            ]
        },
        "messages[1].tool_call_id",
    ),
    ({"chat_template_kwargs": "thinking"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
    ({"chat_template_kwargs": {"frobnicate": 1}}, "chat_template_kwargs.frobnicate"),
    ({"functions": [FN]}, "functions"),
    (
        {
            "messages": tt.ASK + [{"role": "assistant", "content": "<tool_call>"}],
            "continue_final_message": True,
            "tools": tt.TOOLS,
            "tool_choice": "required",
        },
        "tool_choice",
    ),
    ({"tools": tt.TOOLS, "tool_choice": "required", "add_generation_prompt": False}, "tool_choice"),
    (
        {"messages": tt.ASK + [{"role": "tool", "tool_call_id": "c1", "content": "x"}]},
        "messages[1]",
    ),
    (answered_call("{}", "c2"), "messages[2].tool_call_id"),
]


@pytest.mark.parametrize("extra,param", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_tools_and_template_kwargs_are_a_clean_400(tool_url, extra, param):
    r = httpx.post(tool_url + "/v1/chat/completions", json={"messages": tt.ASK, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err


def test_a_named_tool_choice_without_its_name_says_what_is_missing(tool_url):
    body = {"messages": tt.ASK, "tools": tt.TOOLS, "tool_choice": {"type": "function"}}
    err = httpx.post(tool_url + "/v1/chat/completions", json=body).json()["error"]
    assert err["param"] == "tool_choice.function.name", err
    assert err["message"].startswith("tool_choice.function.name is required"), err
    assert "get_weather" in err["message"] and "None" not in err["message"], err
    body = {"model": "tools", "max_tokens": 8, "messages": tt.ASK, "tool_choice": {"type": "tool"}}
    body["tools"] = [{"name": "get_weather", "input_schema": tt.WEATHER["function"]["parameters"]}]
    err = httpx.post(tool_url + "/v1/messages", json=body).json()["error"]  # Anthropic's shape
    assert "name is required" in err["message"] and '"function"' not in err["message"], err


# ------------------------------------------------------------------ the splitter itself
def test_reply_split_does_not_depend_on_round_boundaries(tool_tokenizer):
    """Speculative rounds commit several tokens at once: the same text cut anywhere (markers
    split across rounds, several transitions in one round) splits the same way; a call that
    does not parse stays in the content, verbatim; whitespace between calls is no content."""
    tok = tool_tokenizer
    broken = '<tool_call>\n{"name": get_weather}\n</tool_call>'
    # a function's arguments are an object: a list is no call either
    listed = '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>'
    text = f"<think>\n{tt.THOUGHT}\n</think>\n\nok {tt.TWO_CALLS} then {broken} {listed} end"
    tools = ToolRequest(tuple(tt.TOOLS))
    results = set()
    for step in (1, 2, 3, 7, 11, len(text)):
        reply = ChatReply(tok, ChatPrompt([1], tools=tools))
        for i in range(0, len(text), step):
            reply.feed(text[i : i + step], RoundEvent(tokens=[5]))
        _, finish = reply.finish("stop")
        results.add(
            (
                "".join(reply.reasoning),
                "".join(reply.content),
                finish,
                reply.unparsed,
                tuple((c["function"]["name"], c["function"]["arguments"]) for c in reply.calls),
            )
        )
    assert results == {
        (
            tt.THOUGHT,  # the template's newlines around the thinking belong to neither part
            f"ok  then {broken} {listed} end",  # the "\n" between the two calls is dropped
            "tool_calls",
            2,
            (("get_weather", '{"city": "paris"}'), ("get_weather", '{"city": "rome"}')),
        )
    }


def test_newlines_around_the_thinking_belong_to_neither_part(tool_tokenizer):
    """As Qwen's template strips them from history: the thinking's leading and trailing
    newlines and the answer's leading ones go; newlines inside either part stay."""
    text = "<think>\n\na\n\nb\n</think>\n\nanswer\n\nmore\n"
    for step in range(1, 8):
        reply = ChatReply(tool_tokenizer, ChatPrompt([1]))
        for i in range(0, len(text), step):
            reply.feed(text[i : i + step], RoundEvent(tokens=[5]))
        reply.finish("stop")
        assert "".join(reply.reasoning) == "a\n\nb", step
        assert "".join(reply.content) == "answer\n\nmore\n", step
    # a second section and the answer's later parts keep theirs
    reply = ChatReply(tool_tokenizer, ChatPrompt([1]))
    reply.feed("<think>a\n</think>\n\nmid<think>\nb</think>\n\nc", RoundEvent(tokens=[5]))
    reply.finish("stop")
    assert ("".join(reply.reasoning), "".join(reply.content)) == ("a\nb", "mid\n\nc")


def test_a_call_cut_inside_its_end_marker_is_still_a_call(tool_tokenizer):
    """max_tokens may end a reply inside the end marker after a whole call: the call is
    returned (finish_reason "length"), not its markup as content; a call cut before its
    object closes is dropped (its markup is no answer), the text before it stays."""
    end = tool_tokenizer.tool_call_end
    for cut in range(1, len(end)):
        for step in (1, 5, len(tt.CALL_TEXT)):
            text = tt.CALL_TEXT[:-cut]
            reply = ChatReply(tool_tokenizer, ChatPrompt([1], tools=ToolRequest(tuple(tt.TOOLS))))
            for i in range(0, len(text), step):
                reply.feed(text[i : i + step], RoundEvent(tokens=[5]))
            deltas, finish = reply.finish("length")
            assert finish == "length" and not reply.content and reply.unparsed == 0, cut
            assert [(c["function"]["name"], c["function"]["arguments"]) for c in reply.calls] == [
                ("get_weather", '{"city": "paris"}')
            ]
            assert [d.kind for d in deltas] == ["tool_call"]
    open_call = tt.CALL_TEXT[: tt.CALL_TEXT.index("paris")]
    for before in ("", "\n\n", "Let me look. "):
        for step in (1, 7, 100):
            text = before + open_call
            reply = ChatReply(tool_tokenizer, ChatPrompt([1], tools=ToolRequest(tuple(tt.TOOLS))))
            deltas = []
            for i in range(0, len(text), step):
                deltas += reply.feed(text[i : i + step], RoundEvent(tokens=[5]))
            more, finish = reply.finish("length")
            streamed = "".join(d.text for d in deltas + more if d.kind == "content")
            assert finish == "length" and not reply.calls and reply.dropped == 1
            kept = before if before.strip() else ""  # whitespace before a call is no answer
            assert "".join(reply.content) == streamed == kept and reply.unparsed == 0


def test_a_call_cut_before_its_end_is_dropped_whatever_the_parser_reads(tmp_path):
    """GLM's parser reads any fragment of a call as one (`get_weather` without its
    arguments): a call cut by max_tokens or a client's stop string before its end marker
    is dropped; one the reply ends after (its stop token), or that parallel_tool_calls'
    stop ends, is a call."""
    tok = _tokenizer_with(tt.TEMPLATE, tmp_path / "lenient")
    tok._tool_parser = lambda text, tools: {"name": "get_weather", "arguments": {}}
    prompt = ChatPrompt([1], tools=ToolRequest(tuple(tt.TOOLS)))
    cut = tt.CALL_TEXT[: tt.CALL_TEXT.index("paris")]
    for finish, stop, is_call in (
        ("length", None, False),
        ("stop", "pa", False),  # a client's stop string
        ("stop", None, True),  # the reply ended (its stop token)
        ("stop", tok.tool_call_end, True),  # parallel_tool_calls false
    ):
        reply = ChatReply(tok, prompt)
        reply.feed(cut, RoundEvent(tokens=[5]))
        _, reason = reply.finish(finish, stop)
        assert bool(reply.calls) == is_call and not reply.content
        assert reason == ("tool_calls" if is_call else finish), (finish, stop)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_call_with_arguments_strict_json_cannot_carry_stays_text(tool_tokenizer, value):
    """Python's json reads NaN, Infinity and 1e999; JSON.parse and the Messages body (a float
    out of range) cannot take them: such a call is the model's text, not a call."""
    bad = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": {value}}}}}\n</tool_call>'
    reply = ChatReply(tool_tokenizer, ChatPrompt([1], tools=ToolRequest(tuple(tt.TOOLS))))
    reply.feed(f"{bad} {tt.CALL_TEXT}", RoundEvent(tokens=[5]))
    _, finish = reply.finish("stop")
    assert reply.unparsed == 1 and "".join(reply.content).startswith(bad)
    assert [c["function"]["arguments"] for c in reply.calls] == ['{"city": "paris"}']
    assert finish == "tool_calls"


def test_a_call_inside_the_thinking_goes_back_to_it(tool_tokenizer):
    """A call the model opens inside its thinking section is a call; after it the thinking goes
    on, so its end marker and what follows are no answer until the section closes (a call
    there that does not parse stays in the thinking)."""
    broken = '<tool_call>\n{"name": get_weather}\n</tool_call>'
    text = f"<think>\nso {tt.CALL_TEXT} then {broken} ok\n</think>\n\n{tt.FINAL}"
    results = set()
    for step in (1, 4, 9, len(text)):
        reply = ChatReply(tool_tokenizer, ChatPrompt([1], tools=ToolRequest(tuple(tt.TOOLS))))
        for i in range(0, len(text), step):
            reply.feed(text[i : i + step], RoundEvent(tokens=[5]))
        _, finish = reply.finish("stop")
        calls = tuple((c["function"]["name"], c["function"]["arguments"]) for c in reply.calls)
        results.add(("".join(reply.reasoning), "".join(reply.content), finish, calls))
    assert results == {
        (f"so  then {broken} ok", tt.FINAL, "tool_calls", (("get_weather", '{"city": "paris"}'),))
    }


def test_a_prefilled_call_that_does_not_parse_holds_only_what_follows(tool_tokenizer):
    """The reply to a prefill holds only what follows it: a call the prefill opened that
    does not parse comes back as the model's text after the prefill, not with it again (a
    forced tool_choice's opening, which the client never saw, stays in)."""
    prefix = '\n{"name": "get_weather"'
    after = ", broken}\n</tool_call>"
    for prefilled, want in ((True, after), (False, "<tool_call>" + prefix + after)):
        prompt = ChatPrompt(
            [1], "tool", prefix, tools=ToolRequest(tuple(tt.TOOLS)), call_prefilled=prefilled
        )
        reply = ChatReply(tool_tokenizer, prompt)
        reply.feed(after, RoundEvent(tokens=[5]))
        reply.finish("stop")
        assert (reply.calls, "".join(reply.content)) == ([], want), prefilled


def test_a_think_marker_inside_a_call_is_no_reasoning(tool_tokenizer):
    """reasoning_tokens counts a thinking section's tokens, not a call's text that happens to
    hold a think marker (a call the prompt opened, or one the reply opens)."""
    call = '\n{"name": "get_weather", "arguments": {"city": "<think> paris"}}\n</tool_call>'
    for state, text in (("normal", "<tool_call>" + call + "\nok"), ("tool", call + "\nok")):
        prompt = ChatPrompt([1], state=state, tools=ToolRequest(tuple(tt.TOOLS)))
        reply = ChatReply(tool_tokenizer, prompt)
        ids = tool_tokenizer.encode(text, add_special_tokens=False)
        assert tool_tokenizer.think_start_tokens[0] in ids  # the marker itself, in the call
        reply.feed(text, RoundEvent(tokens=ids))
        reply.finish("stop")
        assert [c["function"]["name"] for c in reply.calls] == ["get_weather"], state
        assert reply.thinking.stats.tokens == 0 and "".join(reply.reasoning) == "", state


def _tokenizer_with(template: str, tmp_path):
    hf = tt._hf_tokenizer(list(tt.vocabulary()))
    hf.chat_template = template
    hf.save_pretrained(str(tmp_path))
    return tt.load_tokenizer(tmp_path)


def test_call_ids_take_the_length_the_template_requires(tmp_path, tool_tokenizer):
    """Mistral's templates refuse history ids that are not 9 alphanumeric characters (or
    none): the ids the server makes are that, so a client can send its calls back; the
    server's own renders that probe the template use such ids too (without, every turn after
    a call, and a forced tool_choice, were a 400)."""
    check = (
        "{% if tool_call.id is not defined or tool_call.id|length != 9 %}"
        "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
        "{% endif %}"
    )
    loop = "{% for tool_call in message.tool_calls or [] %}"
    tok = _tokenizer_with(tt.TEMPLATE.replace(loop, loop + check), tmp_path / "nine")
    chat = ChatTemplate(tok)
    prompt = chat.prompt(tt.ASK, parse_tools_body(), {})
    assert prompt.call_id_length == 9
    reply = ChatReply(tok, prompt)
    reply.feed(tt.CALL_TEXT, RoundEvent(tokens=[5]))
    reply.finish("stop")
    (call,) = reply.calls
    assert len(call["id"]) == 9 and call["id"].isalnum()
    history = tt.ASK + [{"role": "assistant", "content": "", "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": call["id"], "content": tt.RESULT})
    assert chat.prompt(history, parse_tools_body(), {}).ids  # the template takes it back
    forced = chat.prompt(tt.ASK, parse_tools_body(tool_choice="required"), {})
    assert forced.state == "tool"
    with pytest.raises(APIError, match="length 9"):
        chat.prompt(tt.followup("call_1"), parse_tools_body(), {})
    assert ChatTemplate(tool_tokenizer).prompt(tt.ASK, None, {}).call_id_length is None


def test_a_template_filter_that_refuses_history_arguments_is_a_400(tool_pair, tmp_path):
    """History arguments that are no JSON object reach the template as text (the API treats
    them as opaque); a template that maps over them (`|items`, Qwen3.5's and Qwen3-Coder's)
    raises a plain TypeError there: the client's 400 naming messages, not a 500."""
    loop = "{% for tool_call in message.tool_calls or [] %}"
    items = "{% for k, v in tool_call.function.arguments|items %}{{ k }}{% endfor %}"
    tok = _tokenizer_with(tt.TEMPLATE.replace(loop, loop + items), tmp_path / "items")
    pair = Pair.from_models(tool_pair.model, tok, tool_pair.drafter)
    with running(create_app(pair, model_name="tools", default_max_tokens=4)) as base:
        for args, status in (('{"city": "paris"}', 200), ("[1, 2]", 400), ("not json", 400)):
            r = httpx.post(base + "/v1/chat/completions", json=answered_call(args, "c1"))
            assert r.status_code == status, (args, r.text)
            if status == 400:
                err = r.json()["error"]
                assert err["param"] == "messages", err
                assert "the chat template rejected the messages" in err["message"], err


def test_forced_call_opening_follows_the_template(tmp_path):
    """The prefilled opening is read off the template: an XML-style format (mlx-lm's
    qwen3_coder parser) opens with the function's tag; a format that writes the arguments
    before the name cannot force a name (400), but "required" still works; a server thinking
    default needs a template with a switch."""

    def fmt(call):
        return (
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
            "{% for tc in m.tool_calls or [] %}" + call + "{% endfor %}<|im_end|>\n"
            "{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )

    xml = _tokenizer_with(
        fmt(
            "<tool_call>\n<function={{ tc.function.name }}>\n{% for k, v in tc.function.arguments"
            ".items() %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}</function>\n"
            "</tool_call>"
        ),
        tmp_path / "xml",
    )
    assert xml.tool_parser.__module__.endswith("qwen3_coder")
    named = parse_tools_body(tool_choice=WEATHER_CHOICE)
    p = ChatTemplate(xml).prompt(tt.ASK, named, {})
    assert xml.decode(p.ids).endswith("assistant\n<tool_call>\n<function=get_weather>")
    assert p.state == "tool" and p.call_prefix == "\n<function=get_weather>"
    reply = ChatReply(xml, p)
    reply.feed(
        "\n<parameter=city>\nparis\n</parameter>\n</function>\n</tool_call>", RoundEvent(tokens=[5])
    )
    assert reply.finish("stop")[1] == "tool_calls"
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.calls
    ] == [("get_weather", tt.CALL_ARGS)]

    args_first = _tokenizer_with(
        fmt(
            '{% set tool_call = tc.function %}<tool_call>\n{"arguments": '
            '{{ tool_call.arguments | tojson }}, "name": "{{ tool_call.name }}"}\n</tool_call>'
        ),
        tmp_path / "args-first",
    )
    assert args_first.tool_parser.__module__.endswith("json_tools")
    chat = ChatTemplate(args_first)
    with pytest.raises(APIError) as e:
        chat.prompt(tt.ASK, named, {})
    assert e.value.param == "tool_choice" and "cannot be honoured" in e.value.message
    required = chat.prompt(tt.ASK, parse_tools_body(tool_choice="required"), {})
    assert args_first.decode(required.ids).endswith('<tool_call>\n{"arguments":')
    with pytest.raises(DFlash2Error, match="no thinking switch"):
        ChatTemplate(args_first, thinking=False)
    # served: json_tools' grammar ({"name", "arguments"}) cannot follow this opening, so
    # "required" is forced by the opening alone, as it was before that grammar (not a 400)
    vocab = max(128, len(tt.vocabulary()) + 8)
    target = tiny.make_target("llama", vocab=vocab)
    pair = Pair.from_models(target, args_first, tiny.make_drafter(2, 4, vocab=vocab))
    with running(create_app(pair, model_name="t", default_max_tokens=8)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)
        r = client.chat.completions.create(
            model="t", messages=tt.ASK, tools=tt.TOOLS, tool_choice="required", max_tokens=8
        )
        assert r.usage.prompt_tokens == len(required.ids)


def _call_format(call: str) -> str:
    """A chat template whose assistant turns write their tool calls with `call` (tc: one)."""
    return (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for tc in m.tool_calls or [] %}" + call + "{% endfor %}<|im_end|>\n"
        "{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


@pytest.mark.parametrize(
    "parser, call, prefix, rest, call_id",
    [
        (  # GLM: a marker right after the name (the opening ended before it: a 400)
            "glm47",
            "<tool_call>{{ tc.function.name }}{% for k, v in tc.function.arguments.items() %}"
            "<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>",
            "get_weather",
            "<arg_key>city</arg_key><arg_value>paris</arg_value></tool_call>",
            None,
        ),
        (  # Kimi-K2: the template writes the call's id (functions.NAME:0) for the name
            "kimi_k2",
            "<|tool_calls_section_begin|><|tool_call_begin|>{{ tc.id }}<|tool_call_argument_begin|>"
            "{{ tc.function.arguments | tojson }}<|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_call_begin|>functions.get_weather",
            ':0<|tool_call_argument_begin|>{"city": "paris"}<|tool_call_end|>'
            "<|tool_calls_section_end|>",
            "functions.get_weather:0",
        ),
    ],
)
def test_a_named_tool_choice_opens_the_call_with_its_name(
    tmp_path, parser, call, prefix, rest, call_id
):
    tok = _tokenizer_with(_call_format(call), tmp_path / parser)
    assert tok.tool_parser.__module__.endswith(parser)
    p = ChatTemplate(tok).prompt(tt.ASK, parse_tools_body(tool_choice=WEATHER_CHOICE), {})
    assert p.state == "tool" and p.call_prefix.endswith(prefix)
    reply = ChatReply(tok, p)
    reply.feed(rest, RoundEvent(tokens=[5]))
    assert reply.finish("stop")[1] == "tool_calls"
    (got,) = reply.calls
    assert (got["function"]["name"], json.loads(got["function"]["arguments"])) == (
        "get_weather",
        tt.CALL_ARGS,
    )
    assert call_id is None or got["id"] == call_id


def parse_tools_body(**kw) -> ToolRequest:
    return parse_tools({"tools": tt.TOOLS, **kw})


KIMI_SECTION = (  # Kimi-K2's format: one section holds every call of the turn, with its own ids
    "<|tool_calls_section_begin|>"
    + "".join(
        f"<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        f'{{"city": "{city}"}}<|tool_call_end|>'
        for city in ("paris", "rome")
    )
    + "<|tool_calls_section_end|>"
)


@pytest.mark.parametrize("parallel", [True, False])
def test_calls_of_one_block_and_their_ids(tmp_path, parallel):
    """Formats that write several calls in one block (Kimi-K2, MiniMax, pythonic): with
    parallel_tool_calls false the reply stops at the block's end and keeps its first call. The
    model's own call ids are kept while they are distinct; a repeated one is replaced."""
    marker = "{# <|tool_calls_section_begin|> #}"
    tok = _tokenizer_with(tt.TEMPLATE + marker, tmp_path / "kimi")
    assert tok.tool_parser.__module__.endswith("kimi_k2")
    prompt = ChatTemplate(tok).prompt(tt.ASK, parse_tools_body(parallel_tool_calls=parallel), {})
    assert prompt.stops == (() if parallel else ("<|tool_calls_section_end|>",))
    reply = ChatReply(tok, prompt)
    for i in range(0, len(KIMI_SECTION), 5):
        reply.feed(KIMI_SECTION[i : i + 5], RoundEvent(tokens=[5]))
    assert reply.finish("stop")[1] == "tool_calls"
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.calls]
    cities = ["paris", "rome"] if parallel else ["paris"]
    assert calls == [("get_weather", {"city": c}) for c in cities]
    ids = [c["id"] for c in reply.calls]
    assert ids[0] == "functions.get_weather:0" and len(set(ids)) == len(ids)


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_without_an_end_marker(tmp_path, parallel):
    """Mistral's format has no end marker, so no stop can end the reply after the first call:
    with parallel_tool_calls false the reply keeps its first call (it was a 400)."""
    tok = _tokenizer_with(tt.TEMPLATE + "{# [TOOL_CALLS] #}", tmp_path / "mistral")
    assert tok.tool_parser.__module__.endswith("mistral") and not tok.tool_call_end
    prompt = ChatTemplate(tok).prompt(tt.ASK, parse_tools_body(parallel_tool_calls=parallel), {})
    assert prompt.stops == ()
    text = "".join(f'[TOOL_CALLS]get_weather[ARGS]{{"city": "{c}"}}' for c in ("paris", "rome"))
    reply = ChatReply(tok, prompt)
    for i in range(0, len(text), 7):
        reply.feed(text[i : i + 7], RoundEvent(tokens=[5]))
    assert reply.finish("stop")[1] == "tool_calls"
    calls = [json.loads(c["function"]["arguments"])["city"] for c in reply.calls]
    assert calls == (["paris", "rome"] if parallel else ["paris"]) and not reply.content


def test_a_muse_spark_reply_reads_its_message_headers(tmp_path):
    """mlx-lm's Muse Spark format: a reply is messages, each after a header (to=self: the
    thinking; to=NAME: a call; to=user: the answer) whose text is no part of any. The reply
    starts in a header, as mlx_lm.server's does (it came back as content, the thinking too)."""
    from mlx_lm.tokenizer_utils import load

    hf = tt._hf_tokenizer(list(tt.vocabulary()))
    hf.chat_template = tt.TEMPLATE + "{# <atem:function_calls> #}"
    hf.save_pretrained(str(tmp_path / "muse"))
    tok = load(tmp_path / "muse", defaults={"chat_template_type": "muse_spark"})
    assert tok.response_initial_state == "header"
    thought = "to=self<|message|>the user wants paris.<|eom|>"
    call = (
        '<|start|>assistant to=get_weather<|message|><atem:function_calls><atem:invoke name="'
        'get_weather"><atem:parameter name="city">paris</atem:parameter></atem:invoke>'
        "</atem:function_calls><|eom|>"
    )
    answer = "<|start|>assistant to=user<|message|>sunny.<|eot|>"
    for tools, text in ((ToolRequest(tuple(tt.TOOLS)), thought + call), (None, thought + answer)):
        reply = ChatReply(tok, ChatPrompt([1], tools=tools))
        for i in range(0, len(text), 6):
            reply.feed(text[i : i + 6], RoundEvent(tokens=[5]))
        reply.finish("stop")
        assert "".join(reply.reasoning) == "the user wants paris."
        assert "".join(reply.content) == ("" if tools else "sunny.")
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in reply.calls]
        assert calls == ([("get_weather", '{"city": "paris"}')] if tools else [])


def test_tools_and_reasoning_in_one_batch(client):
    """Tool calls and thinking replies generated together (one batch) each come back exactly
    as alone: the reply parsing is per request, downstream of its own text."""
    import threading

    asks = [
        (tt.ASK, {"tools": tt.TOOLS}),
        (tt.ASK_TWO, {"tools": tt.TOOLS}),
        (tt.HI, {}),
        (tt.ASK, {"tools": tt.TOOLS, "tool_choice": "required"}),
    ]

    def reply(r):  # content, reasoning, calls (their ids are new in every response), finish
        return r[0], r[1], [(c["name"], c["arguments"]) for c in r[2]], r[3]

    alone = [reply(streamed(client, m, **kw)) for m, kw in asks]
    assert [len(r[2]) for r in alone] == [1, 2, 0, 1] and alone[2][1]  # calls, a thought
    for attempt in range(3):  # until the requests overlapped (they start together)
        results: list = [None] * len(asks)
        start = threading.Barrier(len(asks))

        def one(i):
            start.wait()
            results[i] = streamed(client, asks[i][0], **asks[i][1])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [reply(r) for r in results] == alone
        if max(r[4].model_extra["dflash2"]["max_batch_size"] for r in results) >= 2:
            break
    else:
        pytest.fail("the requests never ran in one batch")


def test_a_think_marker_a_message_quotes_is_text(tool_tokenizer):
    """A `<think>` in a user's message or a tool result is text there: the prompt leaves no
    section open (the reply starts in the answer, a forced tool_choice can open its call);
    one the reply's own turn opens (a final assistant message to continue) is open."""
    quoted = [
        {"role": "user", "content": "what is <think> for?"},
        {"role": "assistant", "content": "a tag."},
        {"role": "user", "content": "weather in paris?"},
    ]
    template = ChatTemplate(tool_tokenizer)
    p = template.prompt(quoted, None, {})
    assert "<think>" in tool_tokenizer.decode(p.ids) and p.state == "normal"
    assert template.prompt(quoted, parse_tools_body(tool_choice="required"), {}).state == "tool"
    assert template.prompt(quoted, None, {}, prefill="<think>\n").state == "reasoning"


def test_a_value_keeps_a_marker_as_its_text(tool_tokenizer):
    """A response_format reply is its value after at most one thinking section: a think
    marker written inside the value is the value's text, at every round boundary (the usage
    counts only the first section's tokens as thinking)."""
    tok = tool_tokenizer
    cases = [
        ('{"a": "x<think>y</think>z"}', "", '{"a": "x<think>y</think>z"}'),
        ('<think>\nhm\n</think>\n\n{"a": "<think>"}', "hm", '{"a": "<think>"}'),
        (' \n{"a": "</think><think>"}', "", ' \n{"a": "</think><think>"}'),
    ]
    for text, reasoning, content in cases:
        ids = tok.encode(text, add_special_tokens=False)
        for step in (1, 2, 3, 5, len(text)):
            reply = ChatReply(tok, ChatPrompt([1]), value=True)
            for i in range(0, len(text), step):
                reply.feed(text[i : i + step], RoundEvent(tokens=[5]))
            reply.finish("stop")
            got = ("".join(reply.reasoning), "".join(reply.content))
            assert got == (reasoning, content), (text, step)
        reply = ChatReply(tok, ChatPrompt([1]), value=True)
        reply.feed(text, RoundEvent(tokens=ids))
        section = tok.encode(text[: text.index("</think>") + 8], add_special_tokens=False)
        assert reply.thinking.stats.tokens == (len(section) if reasoning else 0), text
    # a round's text is one delta a part, though fed a character at a time before the value
    reply = ChatReply(tok, ChatPrompt([1]), value=True)
    deltas = reply.feed('<think>\nthinking hard\n</think>\n\n{"a": 1}', RoundEvent(tokens=[5]))
    assert [d.kind for d in deltas] == ["reasoning", "content"], deltas
    # without a value (free text) a later section is still a section
    reply = ChatReply(tok, ChatPrompt([1]))
    reply.feed('{"a": "x<think>y</think>z"}', RoundEvent(tokens=[5]))
    assert "".join(reply.reasoning) == "y"


def test_an_empty_reply_with_tools_streams_the_whole_replys_content(client):
    """No text and no call (a stop string before the call): whole, content is ""; streamed,
    the role chunk sets no content (a call-only reply rebuilds to null), so the end sends
    content "" and a client that rebuilds the message gets "" too."""
    kw = dict(tools=tt.TOOLS, stop=["<tool_call>"])
    whole = ask(client, tt.ASK, **kw).choices[0].message
    assert whole.content == "" and not whole.tool_calls
    chunks = [c.choices[0].delta for c in ask(client, tt.ASK, stream=True, **kw) if c.choices]
    assert [d.content for d in chunks if d.content is not None] == [""]
    calls = ask(client, tt.ASK, tools=tt.TOOLS, stream=True)  # a call: content stays null
    assert all(c.choices[0].delta.content is None for c in calls if c.choices)


def test_a_call_max_tokens_cuts_is_no_markup_on_any_endpoint(client, tool_url):
    """A forced call cut by max_tokens: finish_reason "length", no call and none of its
    markup in content, whole or streamed, on chat and on the Responses API (which said
    "incomplete" with a message item of the markup)."""
    kw = dict(tools=[SKY], tool_choice="required", max_tokens=3)
    before = metric(httpx.get(tool_url + "/metrics").text, "dflash2_dropped_tool_calls_total")
    whole = ask(client, tt.ASK, **kw).choices[0]
    assert whole.finish_reason == "length" and not whole.message.tool_calls
    assert "<tool" not in (whole.message.content or "")
    content, _, calls, finish, _ = streamed(client, tt.ASK, **kw)
    assert (content, calls, finish) == ("", [], "length")
    r = client.responses.create(
        model="tools",
        input=tt.ASK,
        tools=[{"type": "function", **SKY["function"]}],
        tool_choice="required",
        max_output_tokens=3,
        temperature=0,
    )
    assert r.status == "incomplete" and "<tool" not in r.output_text
    assert [o.type for o in r.output if o.type != "reasoning"] in ([], ["message"])
    after = metric(httpx.get(tool_url + "/metrics").text, "dflash2_dropped_tool_calls_total")
    assert after - before == 3  # whole, streamed, Responses: each counted


def test_a_chat_prompts_preamble_is_what_conversations_with_its_system_and_tools_share(
    tool_tokenizer,
):
    """A hybrid target's prompt cache keeps the state where another conversation with the
    same system messages and tools branches off (engine/prompt_cache.py): ChatPrompt.preamble,
    found (only when asked) from a rendering with another user message."""
    chat = ChatTemplate(tool_tokenizer)
    system = {"role": "system", "content": "You are an agent."}
    convs = [[system, {"role": "user", "content": q}] for q in ("weather in paris?", "hi")]
    assert chat.prompt(convs[0], parse_tools_body(), {}).preamble == 0  # not asked
    chat.find_preamble = True
    for tools in (parse_tools_body(), None):
        a, b = (chat.prompt(c, tools, {}) for c in convs)
        shared = next(i for i, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y)
        assert a.preamble == b.preamble == shared, tools
        text = tool_tokenizer.decode(a.ids[: a.preamble])
        assert text.endswith("<|im_start|>user\n") and ("get_weather" in text) == bool(tools)
    probe_like = [system, {"role": "user", "content": "\u2063~ a question"}]
    assert chat.prompt(probe_like, None, {}).preamble == b.preamble  # not one id into it
    alone = chat.prompt([{"role": "user", "content": "hi"}], None, {})
    assert alone.preamble == 0  # no system messages, no tools: nothing to share
    with_tools = chat.prompt([{"role": "user", "content": "hi"}], parse_tools_body(), {})
    assert "get_weather" in tool_tokenizer.decode(with_tools.ids[: with_tools.preamble])
