"""The Responses API (POST /v1/responses) with the official `openai` client on a real uvicorn
server on 127.0.0.1, over the tiny model that really thinks and calls tools (tiny_tools.py):
each reply is the chat reply to the same conversation, as output items (reasoning, message,
function_call), whole and as the API's stream events (the client's own stream helper
rebuilds the response from them); tool round trips send the output items back as input;
what it cannot serve is a 400 naming the Responses field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import tiny_tools as tt
from test_serve import running
from test_serve_tools import OK_SCHEMA, ask, tool_pair  # noqa: F401  (tool_pair: fixture)

from dflash2_mlx.serve import create_app
from dflash2_mlx.serve.api_error import APIError
from dflash2_mlx.serve.responses_request import parse_responses

FN = {"type": "function", **tt.WEATHER["function"]}  # the Responses API's tool shape
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def url(tool_pair):  # noqa: F811
    app = create_app(tool_pair, model_name="tools", default_max_tokens=64, context_length=1024)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def respond(client, input, **kw):
    kw.setdefault("max_output_tokens", 64)
    return client.responses.create(model="tools", input=input, temperature=0, **kw)


def events(client, input, **kw):
    kw.setdefault("max_output_tokens", 64)
    stream = client.responses.create(model="tools", input=input, temperature=0, stream=True, **kw)
    out = list(stream)
    assert [e.sequence_number for e in out] == list(range(len(out)))
    assert [e.type for e in out[:2]] == ["response.created", "response.in_progress"]
    return out


def test_reply_is_the_chat_reply_as_output_items(client):
    chat = ask(client, tt.HI).choices[0].message
    r = respond(client, tt.HI)
    assert r.status == "completed" and r.id.startswith("resp_")
    assert (r.temperature, r.top_p) == (0.0, 1.0)  # the values it ran with, not null
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == chat.model_extra["reasoning_content"]
    assert r.output_text == chat.content
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    stream = events(client, tt.HI)
    assert (
        "".join(e.delta for e in stream if e.type == "response.output_text.delta") == r.output_text
    )
    thought = "".join(e.delta for e in stream if e.type == "response.reasoning_text.delta")
    assert thought == r.output[0].content[0].text
    assert stream[-1].type == "response.completed"
    assert stream[-1].response.output_text == r.output_text
    with client.responses.stream(model="tools", input=tt.HI, temperature=0) as s:
        assert s.get_final_response().output_text == r.output_text


def test_every_text_delta_goes_to_a_part_announced_before_it(client):
    """As the Node SDK's stream accumulator rebuilds a response: an item's content part exists
    only from its `content_part.added`, and a delta to a part not announced is an error."""
    stream = events(client, tt.HI)
    parts: dict[str, list[dict]] = {}
    for e in stream:
        if e.type == "response.output_item.added":
            parts[e.item.id] = []
        elif e.type == "response.content_part.added":
            assert e.content_index == len(parts[e.item_id])
            parts[e.item_id].append(e.part.model_dump())
        elif e.type in ("response.output_text.delta", "response.reasoning_text.delta"):
            parts[e.item_id][e.content_index]["text"] += e.delta
        elif e.type == "response.content_part.done":
            assert parts[e.item_id][e.content_index]["text"] == e.part.text
    final = stream[-1].response.output
    assert [i.type for i in final] == ["reasoning", "message"]
    for item in final:
        assert [p["text"] for p in parts[item.id]] == [p.text for p in item.content]
        assert [p["type"] for p in parts[item.id]] == [p.type for p in item.content]


def test_a_reasoning_summary_is_the_thinking_whole(client):
    """Codex and the Agents SDK ask for `reasoning.summary` and show its summary_text: that
    is the thinking itself (no summarizer), whole and in the summary stream events."""
    plain = respond(client, tt.HI)
    assert plain.output[0].summary == []  # not asked for: none
    thought = plain.output[0].content[0].text
    for key, value in (
        ("summary", "auto"),
        ("summary", "detailed"),
        ("generate_summary", "concise"),
    ):
        r = respond(client, tt.HI, reasoning={"effort": "medium", key: value})
        assert [(p.type, p.text) for p in r.output[0].summary] == [("summary_text", thought)]
        assert r.output[0].content[0].text == thought and r.output_text == plain.output_text
        assert r.reasoning.model_dump(exclude_none=True)[key] == value  # echoed
    stream = events(client, tt.HI, reasoning={"summary": "auto"})
    kinds = [e.type for e in stream if "summary" in e.type]
    assert kinds[0] == "response.reasoning_summary_part.added"
    assert kinds[-2:] == [
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    deltas = [e.delta for e in stream if e.type == "response.reasoning_summary_text.delta"]
    assert "".join(deltas) == thought
    with client.responses.stream(model="tools", input=tt.HI, reasoning={"summary": "auto"}) as s:
        final = s.get_final_response()
    assert final.output[0].summary[0].text == thought


def test_instructions_and_reasoning_effort(client):
    system = [{"role": "system", "content": "be kind."}]
    chat = ask(client, system + tt.HI, extra_body=OFF)
    r = respond(client, "hi", instructions="be kind.", reasoning={"effort": "none"})
    assert [i.type for i in r.output] == ["message"]
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_chat_reasoning_effort_is_the_thinking_switch(client, url):
    off = ask(client, tt.HI, reasoning_effort="none").choices[0].message
    assert off.content == ask(client, tt.HI, extra_body=OFF).choices[0].message.content
    assert not off.model_extra.get("reasoning_content")
    on = ask(client, tt.HI, reasoning_effort="max").choices[0].message
    assert on.model_extra["reasoning_content"].strip() == tt.THOUGHT
    assert (
        on.model_extra["reasoning_content"]
        == ask(client, tt.HI).choices[0].message.model_extra["reasoning_content"]
    )
    both = {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}
    for extra in (both, {"reasoning_effort": "huge"}):
        body = {"model": "tools", "messages": tt.HI, **extra}
        r = httpx.post(url + "/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text


def test_reasoning_items_sent_back_are_the_next_turns_reasoning_content(client):
    """As chat's `reasoning_content` on the assistant message they preceded (the template
    renders or drops it); `encrypted_content` alone (include) brings the same text back."""
    r = respond(client, tt.HI, include=["reasoning.encrypted_content"])
    thought = r.output[0].content[0].text
    assert thought.strip() == tt.THOUGHT and r.output[0].encrypted_content
    items = [i.model_dump(exclude_none=True) for i in r.output]
    history = tt.HI + items + [{"role": "user", "content": "thanks"}]
    assert parse_responses({"input": history}).messages[1]["reasoning_content"] == thought
    sealed_only = {k: v for k, v in items[0].items() if k != "content"}
    again = parse_responses({"input": [*tt.HI, sealed_only, *items[1:]]})
    assert again.messages[1]["reasoning_content"] == thought
    assert again.messages[1]["content"] == r.output_text
    # another server's sealed thinking (a Codex conversation begun with OpenAI's models):
    # its summary stands for it, else nothing; refused, it had ended the conversation
    foreign = {**sealed_only, "encrypted_content": "gAAAAABo-opaque"}
    moved = parse_responses({"input": [*tt.HI, foreign, *items[1:]]}).messages[1]
    assert not moved.get("reasoning_content") and moved["content"] == r.output_text
    summary = [{"type": "summary_text", "text": "**Greeting** the user"}]
    moved = parse_responses({"input": [*tt.HI, {**foreign, "summary": summary}, *items[1:]]})
    assert moved.messages[1]["reasoning_content"] == "**Greeting** the user"
    assert respond(client, tt.HI).output[0].encrypted_content is None  # only when included
    # a client that keeps only the summary (the Vercel AI SDK) sends back the same thinking
    summed = respond(client, tt.HI, reasoning={"summary": "auto"}).output[0]
    summary_only = {"type": "reasoning", "id": summed.id, "summary": summed.model_dump()["summary"]}
    again = parse_responses({"input": [*tt.HI, summary_only, *items[1:]]})
    assert again.messages[1]["reasoning_content"] == thought
    bad = {**summary_only, "summary": [{"type": "x"}]}
    with pytest.raises(APIError) as err:
        parse_responses({"input": [*tt.HI, bad, *items[1:]]})
    assert err.value.param == "input[1].summary"


def test_tool_round_trip_with_output_items_sent_back(client):
    r = respond(client, tt.ASK, tools=[FN])
    calls = [i for i in r.output if i.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", tt.CALL_ARGS)]
    assert r.output_text == ""
    # the agent sends back everything it got (reasoning items included) and the result
    history = tt.ASK + [i.model_dump(exclude_none=True) for i in r.output]
    history.append(
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": tt.RESULT}
    )
    final = respond(client, history, tools=[FN])
    assert final.output_text == tt.FINAL
    assert not [i for i in final.output if i.type == "function_call"]
    stream = events(client, tt.ASK, tools=[FN])
    done = [e for e in stream if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [tt.CALL_ARGS]
    assert stream[-1].response.output[-1].id == done[0].item_id


def test_a_namespace_s_functions_are_tools_and_its_calls_say_so(client):
    """Codex groups tools in namespaces: the model sees their functions as tools; a call to
    one carries the namespace, and goes back in the history with it."""
    ns = {"type": "namespace", "name": "weather", "description": "w", "tools": [FN]}
    plain = respond(client, tt.ASK, tools=[FN]).output
    r = respond(client, tt.ASK, tools=[ns])
    calls = [i for i in r.output if i.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        (c.name, c.arguments) for c in plain if c.type == "function_call"
    ]
    assert [c.model_dump()["namespace"] for c in calls] == ["weather"]
    history = tt.ASK + [i.model_dump(exclude_none=True) for i in r.output]
    history.append(
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": tt.RESULT}
    )
    assert respond(client, history, tools=[ns]).output_text == tt.FINAL
    stream = events(client, tt.ASK, tools=[ns], extra_body={"client_metadata": {"turn": "1"}})
    added = [e.item for e in stream if e.type == "response.output_item.added"]
    assert [i.model_dump().get("namespace") for i in added] == ["weather"]


def test_functions_of_one_name_in_two_namespaces_stay_apart():
    """Two MCP servers' `search`: the model sees `namespace__name` for each, and calls to them
    come back, and go back, as (namespace, name)."""
    from dflash2_mlx.serve.responses_output import ResponseBuilder

    body = {
        "input": [
            *tt.ASK,
            {
                "type": "function_call",
                "call_id": "c1",
                "namespace": "b",
                "name": "get_weather",
                "arguments": '{"city": "paris"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": tt.RESULT},
        ],
        "tools": [{"type": "namespace", "name": ns, "tools": [FN]} for ns in ("a", "b")],
        "tool_choice": {"type": "function", "namespace": "a", "name": "get_weather"},
    }
    req = parse_responses(body)
    assert [t["function"]["name"] for t in req.tools.tools] == ["a__get_weather", "b__get_weather"]
    assert req.tools.name == "a__get_weather"  # the forced one
    assert req.messages[1]["tool_calls"][0]["function"]["name"] == "b__get_weather"
    builder = ResponseBuilder("tools", {}, namespaces=req.tool_namespaces)
    call = {"id": "c2", "function": {"name": "b__get_weather", "arguments": "{}"}}
    events = builder._call(call)
    assert (events[-1]["item"]["namespace"], events[-1]["item"]["name"]) == ("b", "get_weather")
    assert events[2]["name"] == "get_weather"
    one = parse_responses({**body, "tools": body["tools"][:1], "tool_choice": None})
    assert [t["function"]["name"] for t in one.tools.tools] == ["get_weather"]  # no clash


def test_structured_output_through_text_format(client):
    fmt = {"type": "json_schema", "name": "reply", "schema": OK_SCHEMA, "strict": True}
    r = respond(client, tt.HI, text={"format": fmt}, max_output_tokens=120)
    assert isinstance(json.loads(r.output_text)["ok"], bool)
    chat_fmt = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    chat = ask(client, tt.HI, response_format=chat_fmt, max_tokens=120)
    assert r.output_text == chat.choices[0].message.content
    assert r.text.format.type == "json_schema"
    # verbosity "medium" is OpenAI's default, what clients send: it changes nothing
    same = respond(
        client, tt.HI, text={"format": fmt, "verbosity": "medium"}, max_output_tokens=120
    )
    assert same.output_text == r.output_text


def test_cut_by_max_output_tokens_is_incomplete(client):
    r = respond(client, tt.HI, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert events(client, tt.HI, max_output_tokens=3)[-1].type == "response.incomplete"
    # cut inside the thinking: the reasoning item alone, as OpenAI's API (no empty message)
    assert [i.type for i in r.output] == ["reasoning"], r.output


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "x"}]}]},
            "tools[0].tools[0].type",
        ),
        ({"tools": [FN, FN]}, "tools[1].name"),  # two tools of one name
        (
            {"tools": [FN, {"type": "namespace", "name": "n", "tools": [{**FN, "parameters": 3}]}]},
            "tools[1].tools[0].parameters",
        ),
        ({"tools": [{"type": "namespace", "tools": [FN]}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": 3}]}, "tools[0].parameters"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "txt": "hi"}]}]},
            "input[0].content[0].text",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
            "input[0].content[0].text",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].id"),  # not one of ours
        ({"input": [{"type": "function_call", "call_id": "c"}]}, "input[0].name"),
        ({"input": None}, "input"),
        ({"text": {"format": {"type": "json_schema", "schema": 3}}}, "text.format.schema"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"reasoning": {"effort": []}}, "reasoning.effort"),
        ({"reasoning": {"effort": "none"}, "chat_template_kwargs": 3}, "chat_template_kwargs"),
        ({"input": [{"role": [], "content": "x"}]}, "input[0].role"),
        ({"input": []}, "input"),
        (
            {"input": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": 5}]},
            "input[1].content",
        ),
        ({"instructions": "x", "input": [{"role": "system", "content": {}}]}, "input[0].content"),
        ({"reasoning": {"effort": "low", "summary": "short"}}, "reasoning.summary"),
        ({"reasoning": {"generate_summary": 1}}, "reasoning.generate_summary"),
        ({"reasoning": {"effort": "high", "bogus": 1}}, "reasoning.bogus"),
        ({"include": ["reasoning.bogus"]}, "include"),
        (
            {"reasoning": {"effort": "none"}, "chat_template_kwargs": {"enable_thinking": True}},
            "reasoning.effort",
        ),
        ({"max_output_tokens": 5000}, "max_output_tokens"),  # past the context: the handler's
        # a switch the client sent itself is named as sent, not as reasoning.effort
        (
            {"chat_template_kwargs": {"enable_thinking": "yes"}},
            "chat_template_kwargs.enable_thinking",
        ),
        # accepted and unused, but of the reference API's types
        ({"max_tool_calls": "x"}, "max_tool_calls"),
        ({"user": 5}, "user"),
        ({"metadata": {"k": {"nested": 1}}}, "metadata"),
        # the chat completions shapes of a tool and a tool_choice (hand-written clients mix them)
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].function"),
        (
            {
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tool_choice.function",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
                    {"type": "function_call", "call_id": "b", "name": "f", "arguments": "[1"},
                    {"type": "function_call_output", "call_id": "c", "output": "x"},
                ]
            },
            "input[3].call_id",
        ),
        (
            {
                "input": [
                    {"type": "function_call_output", "call_id": "a", "output": [{"type": "x"}]}
                ]
            },
            "input[0].output[0]",
        ),
        (  # a Chat-style call on a message item would be lost unsaid
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
                ]
            },
            "input[1].tool_calls",
        ),
        ({"input": [{"role": "user", "content": "hi", "foo": 1}]}, "input[0].foo"),
    ],
)
def test_what_it_cannot_serve_is_a_400_naming_the_field(url, extra, param):
    body = {"model": "tools", "input": "hi", **extra}
    r = httpx.post(url + "/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_an_item_reference_without_a_string_id_says_so(url):
    """It was "item 'None' is not one of this server's recent replies"."""
    for ref, code in [({}, "missing_required_parameter"), ({"id": 5}, "invalid_type")]:
        body = {"model": "tools", "input": [{"type": "item_reference", **ref}]}
        err = httpx.post(url + "/v1/responses", json=body).json()["error"]
        assert (err["param"], err["code"]) == ("input[0].id", code), err
        assert err["message"] == "input[0].id must be a string", err


def test_earlier_output_items_sent_back_by_reference(client, url):
    """The Vercel AI SDK's OpenAI provider sends a turn's earlier output items back as
    `item_reference`s (its store defaults to true): the server's recent items resolve, so
    the turn is the one with the items sent whole; an id it never made is a 400 saying what
    to send instead."""
    first = respond(client, tt.HI)
    items = [i.model_dump(exclude_none=True) for i in first.output]
    assert [i["type"] for i in items] == ["reasoning", "message"]
    refs = [{"type": "item_reference", "id": i["id"]} for i in items]
    thanks = [{"role": "user", "content": "thanks"}]
    whole = respond(client, tt.HI + items + thanks)
    by_reference = respond(client, tt.HI + refs + thanks)
    assert by_reference.output_text == whole.output_text
    assert by_reference.usage.input_tokens == whole.usage.input_tokens
    body = {"model": "tools", "input": [*tt.HI, {"type": "item_reference", "id": "msg_x"}]}
    r = httpx.post(url + "/v1/responses", json=body)
    assert r.status_code == 400 and "store = false" in r.json()["error"]["message"]


def test_two_calls_sent_back_make_one_assistant_turn(client):
    """A turn with two calls (and the text between them) goes back as the one assistant
    message chat would send: the same prompt, token for token."""
    r = respond(client, tt.ASK_TWO, tools=[FN])
    calls = [i for i in r.output if i.type == "function_call"]
    assert [i.type for i in r.output] == ["function_call"] * 2  # no "\n" message between
    history = tt.ASK_TWO + [i.model_dump(exclude_none=True) for i in r.output]
    history += [
        {"type": "function_call_output", "call_id": c.call_id, "output": tt.RESULT} for c in calls
    ]
    again = respond(client, history, tools=[FN], max_output_tokens=1)
    chat = ask(client, tt.ASK_TWO, tools=tt.TOOLS).choices[0].message
    chat_history = (
        tt.ASK_TWO
        + [chat]
        + [{"role": "tool", "tool_call_id": c.id, "content": tt.RESULT} for c in chat.tool_calls]
    )
    assert (
        again.usage.input_tokens
        == ask(client, chat_history, tools=tt.TOOLS, max_tokens=1).usage.prompt_tokens
    )


def test_an_assistant_refusal_part_is_its_text(url):
    """An earlier assistant turn's refusal part (replayed output items) reads as that turn's
    text, as on chat completions; in a user turn it stays a 400."""

    def prompt_tokens(part):
        turn = {"type": "message", "role": "assistant", "content": [part]}
        body = {"model": "tools", "input": [*tt.HI, turn, *tt.HI], "max_output_tokens": 1}
        r = httpx.post(url + "/v1/responses", json=body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens"]

    refused = prompt_tokens({"type": "refusal", "refusal": "no way"})
    assert refused == prompt_tokens({"type": "output_text", "text": "no way"})
    user = [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]
    r = httpx.post(url + "/v1/responses", json={"model": "tools", "input": user})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("input[0].content")


def test_a_function_that_leaves_strict_out_is_strict_where_it_can_be(url):
    """The Responses API's `strict` defaults to true: left out (or null), the call is held to
    its schema as with strict true; strict false is not held; and where no grammar can hold
    it (a schema llguidance refuses) the call goes unheld rather than a 400, which an explicit
    strict true still gets."""
    rome = {**FN, "parameters": {**FN["parameters"], "properties": {"city": {"enum": ["rome"]}}}}

    def city(tool: dict):
        body = {"model": "tools", "input": tt.ASK, "tools": [tool], **OFF, "temperature": 0}
        r = httpx.post(url + "/v1/responses", json={**body, "max_output_tokens": 64})
        assert r.status_code == 200, r.text
        calls = [o for o in r.json()["output"] if o["type"] == "function_call"]
        return {json.loads(c["arguments"]).get("city") for c in calls}

    assert city(rome) == city({**rome, "strict": None}) == city({**rome, "strict": True})
    assert city(rome) == {"rome"} and "rome" not in city({**rome, "strict": False})
    broken = {**FN, "parameters": {"type": "object", "properties": {"x": {"$ref": "#/nope"}}}}
    assert city(broken) is not None  # unheld, answered
    body = {"model": "tools", "input": tt.ASK, "tools": [{**broken, "strict": True}]}
    assert httpx.post(url + "/v1/responses", json=body).status_code == 400
