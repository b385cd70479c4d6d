"""Anthropic's Messages API (POST /v1/messages) with the official `anthropic` client on a real
uvicorn server on 127.0.0.1, over the tiny model that really thinks and calls tools
(tiny_tools.py): each reply is the chat reply to the same conversation as content blocks
(thinking, text, tool_use), whole and streamed (the client's stream helper rebuilds the
message from the events); tool round trips send the blocks back; stop reasons; errors in
Anthropic's shape, naming the Messages field; the API key as x-api-key."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
import tiny_tools as tt
from test_serve import pair, running  # noqa: F401  (pair: fixture)
from test_serve_tools import ask, tool_pair  # noqa: F401  (tool_pair: fixture)

from dflash2_mlx.serve import create_app
from dflash2_mlx.serve.messages_output import MessageBuilder
from dflash2_mlx.serve.reply import Delta
from dflash2_mlx.serve.security import SecurityPolicy

TOOL = {
    "name": "get_weather",
    "description": tt.WEATHER["function"]["description"],
    "input_schema": tt.WEATHER["function"]["parameters"],
}


@pytest.fixture(scope="module")
def url(tool_pair):  # noqa: F811
    app = create_app(tool_pair, model_name="tools", default_max_tokens=64, context_length=1024)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


def send(client, messages, **kw):
    kw.setdefault("max_tokens", 64)
    return client.messages.create(model="tools", messages=messages, **kw)  # greedy: the default


def test_reply_is_the_chat_reply_as_blocks(client):
    chat = ask(client_openai(client), tt.HI).choices[0].message
    r = send(client, tt.HI)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == chat.model_extra["reasoning_content"]
    assert r.content[1].text == chat.content
    assert r.stop_reason == "end_turn" and r.id.startswith("msg_")
    assert r.usage.output_tokens > 0
    with client.messages.stream(model="tools", messages=tt.HI, max_tokens=64) as s:
        raw = list(s)
        events = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in raw]
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == chat.content and final.stop_reason == "end_turn"
    # the stream's usage is the whole message's: dflash2's statistics and cache fields too
    streamed = next(e for e in raw if e.type == "message_delta").usage.model_dump()
    assert streamed["dflash2"]["rounds"] == r.usage.model_extra["dflash2"]["rounds"] > 0
    assert streamed["cache_creation_input_tokens"] == 0
    # as Anthropic's: a thinking block's last delta before its stop is its signature
    first_stop = events.index(("content_block_stop", None))
    assert ("content_block_delta", "signature_delta") in events[:first_stop]


def client_openai(client):
    import openai

    return openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="unused", max_retries=0)


def test_system_and_thinking_switch(client):
    chat = ask(
        client_openai(client),
        [{"role": "system", "content": "be kind."}] + tt.HI,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    r = send(client, tt.HI, system="be kind.", thinking={"type": "disabled"})
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == chat.choices[0].message.content
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    # an empty system prompt is none: the same prompt as without one
    empty = client.messages.count_tokens(model="tools", messages=tt.HI, system="")
    assert (
        empty.input_tokens
        == client.messages.count_tokens(model="tools", messages=tt.HI).input_tokens
    )
    with_system = client.messages.count_tokens(model="tools", messages=tt.HI, system="x")
    assert with_system.input_tokens > empty.input_tokens


def test_tool_round_trip_with_blocks_sent_back(client):
    r = send(client, tt.ASK, tools=[TOOL])
    assert r.stop_reason == "tool_use"
    uses = [b for b in r.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("get_weather", tt.CALL_ARGS)]
    assert uses[0].id.startswith("toolu_")  # Anthropic's form of a tool_use id
    history = tt.ASK + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": tt.RESULT}],
        },
    ]
    final = send(client, history, tools=[TOOL])
    assert final.stop_reason == "end_turn"
    assert "".join(b.text for b in final.content if b.type == "text") == tt.FINAL
    with client.messages.stream(model="tools", messages=tt.ASK, tools=[TOOL], max_tokens=64) as s:
        streamed = s.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        ("get_weather", tt.CALL_ARGS)
    ]


def test_two_calls_are_two_tool_use_blocks(client):
    """The template's "\n" between two calls is no text block (whole or streamed)."""
    r = send(client, tt.ASK_TWO, tools=[TOOL])
    assert [b.type for b in r.content] == ["tool_use", "tool_use"] and r.stop_reason == "tool_use"
    with client.messages.stream(
        model="tools", messages=tt.ASK_TWO, tools=[TOOL], max_tokens=64
    ) as s:
        assert [b.type for b in s.get_final_message().content] == ["tool_use", "tool_use"]


def test_stop_reasons(client):
    assert send(client, tt.HI, max_tokens=3).stop_reason == "max_tokens"
    full = send(client, tt.HI, thinking={"type": "disabled"}).content[0].text
    stop = full[3:5]
    r = send(client, tt.HI, thinking={"type": "disabled"}, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == full[: full.index(stop)]


def test_what_claude_code_sends_by_default(client, url, pair):  # noqa: F811
    """Claude Code's defaults: adaptive thinking (the template's default: the tiny model
    thinks, a model without thinking answers), an effort (no thinking switch, as Anthropic's),
    context_management clearing past thinking (the template renders past thinking its way)."""
    default = send(client, tt.HI)
    claude = {
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }
    r = send(client, tt.HI, extra_body=claude)
    assert [(b.type, getattr(b, "text", None)) for b in r.content] == [
        (b.type, getattr(b, "text", None)) for b in default.content
    ]
    assert [b.type for b in r.content] == ["thinking", "text"]
    with running(create_app(pair, model_name="tiny", default_max_tokens=4)) as base:
        body = {"model": "tiny", "max_tokens": 4, "messages": tt.HI, **claude}
        r = httpx.post(base + "/v1/messages", json=body)  # a model that never thinks
        assert r.status_code == 200 and r.json()["content"][0]["type"] == "text", r.text
        enabled = {**body, "thinking": {"type": "enabled", "budget_tokens": 9}}
        assert httpx.post(base + "/v1/messages", json=enabled).status_code == 400


def test_a_thread_is_refused_so_the_sdks_tool_runner_goes_on_without_one(url):
    """Anthropic's server-held conversations (`thread`) are not held here. The refusal carries
    the error_code on which the SDK's tool_runner (which asks for a thread by default) sends
    the whole conversation instead, and the run goes on."""
    r = httpx.post(
        url + "/v1/messages",
        json={"model": "tools", "max_tokens": 8, "messages": tt.HI, "thread": {"type": "create"}},
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["details"] == {"error_code": "thread_unsupported_request"}
    assert err["message"].startswith("thread: this server holds no conversations")
    sent: list[dict] = []
    hooks = {"request": [lambda req: sent.append(json.loads(req.content))]}
    client = anthropic.Anthropic(
        base_url=url,
        api_key="unused",
        max_retries=0,
        http_client=anthropic.DefaultHttpxClient(event_hooks=hooks),
    )
    if not hasattr(client.beta.messages, "tool_runner"):
        pytest.skip("this anthropic SDK has no tool_runner")

    @anthropic.beta_tool
    def get_weather(city: str) -> str:
        """the weather in a city"""
        return tt.RESULT

    runner = client.beta.messages.tool_runner(
        model="tools", max_tokens=64, tools=[get_weather], messages=tt.ASK
    )
    replies = list(runner)
    assert replies and replies[-1].stop_reason in ("end_turn", "max_tokens")
    assert all("thread" not in body for body in sent[1:]), sent
    assert len(sent) == len(replies) + ("thread" in sent[0])


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0].type",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "w"}]}, "tools[0].type"),
        ({"tools": [{"name": "f", "input_schema": 3}]}, "tools[0].input_schema"),
        ({"tool_choice": {"type": "maybe"}}, "tool_choice.type"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "display": "omitted"}}, "thinking.display"),
        ({"tool_choice": {"type": ["any"]}}, "tool_choice.type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice.type 'any' needs tools"),
        ({"messages": tt.HI + [{"role": "assistant", "content": "hi "}]}, "messages[1]"),
        (
            {
                "messages": tt.HI + [{"role": "assistant", "content": "hi"}],
                "thinking": {"type": "enabled"},
            },
            "messages[1]",
        ),
        (
            {
                "messages": tt.ASK
                + [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}],
                    }
                ]
            },
            "messages[1]",
        ),
        ({"temperature": -1}, "temperature"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}],
                    }
                ]
            },
            "messages[0].content[0]: a tool result must follow an assistant turn that calls tools",
        ),
        (
            {
                "messages": tt.ASK
                + [
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "zzz", "content": "x"}],
                    },
                ],
                "tools": [TOOL],
            },
            "messages[2].content[0].tool_use_id",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": 3}}},
            "output_config.format.schema",
        ),
        ({"output_config": {"effort": "huge"}}, "output_config.effort"),
        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_"),
        (  # Anthropic's words, on which Claude Code moves the text into a user turn
            {"messages": [*tt.HI, {"role": "system", "content": "x"}]},
            'Unexpected role "system"',
        ),
        ({"stop_sequences": "x"}, "stop_sequences"),
        ({"messages": []}, "at least one message"),
        # empty turns: Anthropic's 400s (only a final assistant prefill may be empty)
        ({"messages": [{"role": "user", "content": ""}]}, "messages[0]: all messages must"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0]: all messages must"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
            "messages[0].content[0]: text content blocks must contain non-whitespace text",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": " \n"}]}]},
            "messages[0].content[0]: text content blocks must contain non-whitespace text",
        ),
        ({"messages": [{"role": "user", "content": "\t "}]}, "messages[0]: all messages must"),
        (
            {"messages": [*tt.HI, {"role": "assistant", "content": ""}, *tt.HI]},
            "messages[1]: all messages must",
        ),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"thinking": {"type": "adaptive", "budget_tokens": 9}}, "thinking.budget_tokens"),
        ({"tools": [TOOL], "tool_choice": {"type": "any", "name": "f"}}, "tool_choice.name"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"tools": [TOOL], "tool_choice": "auto"}, 'tool_choice must be an object, e.g. {"type"'),
        ({"thinking": "enabled"}, 'thinking must be an object, e.g. {"type": "enabled"}'),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {}, "x": 1}}},
            "output_config.format.x",
        ),
        # accepted and unused, but of the reference API's types
        ({"metadata": "x"}, "metadata must be an object"),
        ({"metadata": {"user_id": 5}}, "metadata must be an object whose user_id is a string"),
        ({"speed": [1, 2]}, "speed must be a string"),
        ({"inference_geo": {"a": 1}}, "inference_geo must be a string"),
        ({"service_tier": 5}, "service_tier must be a string"),
        ({"cache_control": 5}, "cache_control must be an object"),
    ],
)
def test_errors_take_anthropics_shape_and_name_the_field(url, extra, needle):
    body = {"model": "tools", "max_tokens": 8, "messages": tt.HI, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(url + "/v1/messages", json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"], err


def test_this_servers_sampling_additions_as_on_chat(url, tool_pair):  # noqa: F811
    """seed, min_p, the penalties (and repeat_penalty) as chat takes them: an SDK's extra_body
    (a Messages client could not get a reproducible sampled reply; Responses took them)."""

    def reply(**extra):
        body = {"model": "tools", "max_tokens": 12, "messages": tt.HI, **extra}
        r = httpx.post(url + "/v1/messages", json=body)
        assert r.status_code == 200, r.text
        return r.json()["content"]

    sampled = {"temperature": 1.5, "seed": 7, "min_p": 0.01}
    assert reply(**sampled) == reply(**sampled)
    assert len({json.dumps(reply(temperature=1.5, seed=s)) for s in range(4)}) > 1
    assert reply(repetition_penalty=1.8) == reply(repeat_penalty=1.8)
    plain = reply(temperature=0)
    ban = {str(i): -100 for i in tool_pair.tokenizer.encode(plain[0]["thinking"])}
    assert reply(temperature=0, logit_bias=ban) != plain  # the scripted reply cannot come
    r = httpx.post(
        url + "/v1/messages",
        json={"model": "tools", "max_tokens": 4, "messages": tt.HI, "repetition_penalty": -1},
    )
    assert r.status_code == 400 and "repetition_penalty" in r.json()["error"]["message"]
    r = httpx.post(
        url + "/v1/responses",
        json={"model": "tools", "input": "hi", "max_output_tokens": 8, "repeat_penalty": 1.8},
    )
    assert r.status_code == 200, r.text


def test_count_tokens_refuses_generation_fields(url):
    """As Anthropic's: a count is of a prompt; max_tokens, sampling and stops are refused."""
    body = {"model": "tools", "messages": tt.HI}
    assert httpx.post(url + "/v1/messages/count_tokens", json=body).status_code == 200
    for extra in ({"max_tokens": 8}, {"temperature": 5}, {"stop_sequences": ["x"]}, {"seed": 1}):
        r = httpx.post(url + "/v1/messages/count_tokens", json={**body, **extra})
        assert r.status_code == 400, r.text
        assert (
            r.json()["error"]["message"] == f"{next(iter(extra))}: Extra inputs are not permitted"
        )


def test_past_the_context_it_generates_up_to_the_window(tool_pair):  # noqa: F811
    """As Anthropic's newer models: max_tokens past the context's room is no 400; the reply
    stops at the context's end, stop_reason model_context_window_exceeded. A prompt that
    leaves no room is Anthropic's "prompt is too long"."""
    app = create_app(tool_pair, model_name="tools", context_length=20)
    with running(app) as base:
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        r = send(client, tt.HI, max_tokens=4096)
        prompt = r.usage.input_tokens + r.usage.cache_read_input_tokens
        assert r.stop_reason == "model_context_window_exceeded"
        assert prompt + r.usage.output_tokens == 20
        short = send(client, tt.HI, max_tokens=3)
        assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
        with pytest.raises(anthropic.BadRequestError) as e:
            send(client, [{"role": "user", "content": "hi " * 30}])
        assert e.value.body["error"]["message"].startswith("prompt is too long: ")
        assert e.value.body["error"]["message"].endswith(" tokens > 19 maximum")


def test_a_forced_call_max_tokens_cuts_leaves_no_markup(client):
    """tool_choice any, cut by max_tokens inside the call: no tool_use and no text block of
    the call's markup, whole or streamed; stop_reason max_tokens."""
    kw = dict(tools=[TOOL], tool_choice={"type": "any"}, max_tokens=3)
    r = send(client, tt.ASK, **kw)
    assert r.stop_reason == "max_tokens" and all(b.type != "tool_use" for b in r.content)
    assert not any("<tool" in getattr(b, "text", "") for b in r.content)
    with client.messages.stream(model="tools", messages=tt.ASK, **kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content == r.content


def test_a_reply_cut_after_a_call_stops_for_max_tokens():
    """The call after the complete one may be what max_tokens cut: the client must not take
    the turn for finished (Anthropic says max_tokens whatever came before)."""
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "paris"}'}
    deltas = [Delta("tool_call", call=call), Delta("content", '<tool_call>\n{"name": "get')]
    usage_ = {"input_tokens": 3, "output_tokens": 9, "cache_read_input_tokens": 0}
    cut = MessageBuilder("tools", []).whole(deltas, "length", None, usage_)
    assert [b["type"] for b in cut["content"]] == ["tool_use", "text"]
    assert cut["stop_reason"] == "max_tokens"
    done = MessageBuilder("tools", []).whole(deltas[:1], "tool_calls", None, usage_)
    assert done["stop_reason"] == "tool_use"


def test_same_role_turns_combine_and_blocks_join_by_lines(client):
    """Consecutive user turns are one turn (as Anthropic combines them); text blocks join
    with a newline, as chat joins text parts."""
    both = [{"role": "user", "content": "weather in"}, {"role": "user", "content": "paris?"}]
    blocks = [{"type": "text", "text": "weather in"}, {"type": "text", "text": "paris?"}]
    joined = [{"role": "user", "content": "weather in\nparis?"}]
    want = client.messages.count_tokens(model="tools", messages=joined).input_tokens
    for messages in (both, [{"role": "user", "content": blocks}]):
        assert client.messages.count_tokens(model="tools", messages=messages).input_tokens == want
    system = client.messages.count_tokens(model="tools", messages=tt.HI, system=blocks)
    lines = client.messages.count_tokens(model="tools", messages=tt.HI, system="weather in\nparis?")
    assert system.input_tokens == lines.input_tokens


def test_thinking_blocks_sent_back_are_the_turns_reasoning_content():
    """As the Responses API reads its reasoning items: the template keeps or drops them by
    its own rule (Qwen's keeps the current turn's across its calls, Claude Code's loop)."""
    from dflash2_mlx.serve.messages_request import parse_messages

    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "x"}}
    turn = [
        {"type": "thinking", "thinking": "I need the weather tool.", "signature": "s"},
        {"type": "redacted_thinking", "data": "opaque"},
        call,
    ]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    body = {
        "max_tokens": 8,
        "messages": [
            *tt.ASK,
            {"role": "assistant", "content": turn},
            {"role": "user", "content": [result]},
        ],
    }
    assistant = parse_messages(body).messages[1]
    assert assistant["reasoning_content"] == "I need the weather tool."
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["get_weather"]


def test_the_api_key_as_x_api_key(tool_pair):  # noqa: F811
    policy = SecurityPolicy(api_key="sesame")
    app = create_app(tool_pair, model_name="tools", default_max_tokens=4, security=policy)
    with running(app) as base:
        ok = anthropic.Anthropic(base_url=base, api_key="sesame", max_retries=0)
        assert ok.messages.create(model="tools", max_tokens=4, messages=tt.HI).content
        bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(model="tools", max_tokens=4, messages=tt.HI)
        assert e.value.body["error"]["type"] == "authentication_error"


def test_structured_output_through_output_config(client):
    import json

    from test_serve_tools import OK_SCHEMA

    fmt = {"type": "json_schema", "schema": OK_SCHEMA}
    r = send(client, tt.HI, output_config={"format": fmt}, max_tokens=120)
    text = "".join(b.text for b in r.content if b.type == "text")
    assert isinstance(json.loads(text)["ok"], bool)


def test_count_tokens_is_the_prompt_a_message_would_prefill(client):
    r = send(client, tt.ASK, tools=[TOOL], system="be kind.", max_tokens=1)
    n = client.messages.count_tokens(
        model="tools", messages=tt.ASK, tools=[TOOL], system="be kind."
    )
    assert n.input_tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(model="tools", messages=[{"role": "robot", "content": "x"}])
    assert "messages[0].role" in e.value.body["error"]["message"]


def test_a_thinking_budget_ends_the_thinking_there(client, tool_pair):  # noqa: F811
    """thinking.budget_tokens: the section holds at most that many tokens, then its end
    marker is forced and the model answers (engine/budget.py: exact, tested there)."""
    free = send(client, tt.HI, max_tokens=64)
    free_thought = free.content[0].thinking
    r = send(client, tt.HI, max_tokens=64, thinking={"type": "enabled", "budget_tokens": 4})
    assert [b.type for b in r.content][:1] == ["thinking"]
    cut = r.content[0].thinking
    assert cut != free_thought and free_thought.startswith(cut)
    assert len(tool_pair.tokenizer.encode(cut, add_special_tokens=False)) <= 4
    assert r.stop_reason in ("end_turn", "max_tokens")


def test_thinking_budget_on_chat_completions(client, url):
    """The same budget through /v1/chat/completions (`thinking_budget`, an extension field):
    the reasoning is the Messages reply's thinking, cut at the same place."""
    r = send(client, tt.HI, max_tokens=64, thinking={"type": "enabled", "budget_tokens": 4})
    body = {"model": "tools", "messages": tt.HI, "max_tokens": 64, "thinking_budget": 4}
    chat = httpx.post(url + "/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert chat["reasoning_content"] == r.content[0].thinking
    assert chat["content"] == "".join(b.text for b in r.content if b.type == "text")
    bad = httpx.post(url + "/v1/chat/completions", json={**body, "thinking_budget": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "thinking_budget"
    none = httpx.post(url + "/v1/chat/completions", json={**body, "thinking_budget": 0})
    message = none.json()["choices"][0]["message"]  # 0: the section's end marker comes first
    assert chat["reasoning_content"] and not message.get("reasoning_content")


def test_a_server_wide_thinking_budget(tool_pair, url):  # noqa: F811
    """`--thinking-budget` (create_app's thinking_budget) for requests that give none; a
    request's own wins; refused at start for a model without thinking markers."""
    body = {"model": "tools", "messages": tt.HI, "max_tokens": 64}
    explicit = httpx.post(url + "/v1/chat/completions", json={**body, "thinking_budget": 3})
    free = httpx.post(url + "/v1/chat/completions", json=body).json()["choices"][0]["message"]
    app = create_app(tool_pair, model_name="tools", default_max_tokens=64, thinking_budget=3)
    with running(app) as base:
        got = httpx.post(base + "/v1/chat/completions", json=body).json()["choices"][0]
        assert got["message"] == explicit.json()["choices"][0]["message"] != free
        own = httpx.post(base + "/v1/chat/completions", json={**body, "thinking_budget": 1000})
        assert own.json()["choices"][0]["message"] == free
        assert httpx.get(base + "/v1/models").json()["data"][0]["dflash2"]["thinking_budget"] == 3
    import tiny
    from test_serve import make_tokenizer

    from dflash2_mlx.api import Pair
    from dflash2_mlx.errors import DFlash2Error

    plain = Pair.from_models(tiny.make_target("llama"), make_tokenizer(), tiny.make_drafter(2))
    with pytest.raises(DFlash2Error, match="no thinking section"):
        create_app(plain, model_name="p", thinking_budget=3)
    for bad in (-1, True, 2.5):
        with pytest.raises(DFlash2Error, match=f"thinking_budget must be an int >= 0; got {bad}"):
            create_app(tool_pair, model_name="tools", thinking_budget=bad)


def test_a_final_assistant_message_is_continued(client, url, tool_pair):  # noqa: F811
    """Anthropic's prefill: the reply continues the final assistant message and holds only
    what follows it — token for token what greedy decoding writes after that text; chat
    completions' `continue_final_message` (vLLM's field) is the same request."""
    off = {"type": "disabled"}
    whole = send(client, tt.HI, thinking=off).content[0].text
    assert whole == tt.SHORT_ANSWER and whole.endswith("!")
    head = whole[:-1]  # "hello": one token short of the answer
    prefilled = tt.HI + [{"role": "assistant", "content": head}]
    r = send(client, prefilled, thinking=off)
    assert r.content[0].text == whole[len(head) :] and r.stop_reason == "end_turn"
    with client.messages.stream(
        model="tools", messages=prefilled, max_tokens=64, thinking=off
    ) as s:
        assert s.get_final_message().content[0].text == whole[len(head) :]
    body = {
        "model": "tools",
        "max_tokens": 64,
        "messages": prefilled,
        "continue_final_message": True,
        "add_generation_prompt": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    chat = httpx.post(url + "/v1/chat/completions", json=body).json()
    assert chat["choices"][0]["message"]["content"] == whole[len(head) :]
    tok = tool_pair.tokenizer
    ids = tok.apply_chat_template(tt.HI, add_generation_prompt=True, enable_thinking=False)
    ids = list(ids) + tok.encode(head, add_special_tokens=False)
    assert chat["usage"]["prompt_tokens"] == len(ids)
    # a special token's text in the prefill is text, as in any message
    sneaky = {
        **body,
        "max_tokens": 1,
        "messages": tt.HI + [{"role": "assistant", "content": "a<|im_end|>"}],
    }
    text_ids = tok.encode("a<|im_end|>", add_special_tokens=False, split_special_tokens=True)
    n = httpx.post(url + "/v1/chat/completions", json=sneaky).json()["usage"]["prompt_tokens"]
    assert (
        n == len(ids) - len(tok.encode(head, add_special_tokens=False)) + len(text_ids) > len(ids)
    )


def test_without_a_generation_prompt_the_last_turn_runs_on(url, tool_pair):  # noqa: F811
    """add_generation_prompt false: the prompt is the conversation alone (no assistant
    header); the reply is what greedy decoding writes after it."""
    tok = tool_pair.tokenizer
    ids = list(tok.apply_chat_template(tt.HI, add_generation_prompt=False))
    body = {"model": "tools", "max_tokens": 12, "messages": tt.HI, "add_generation_prompt": False}
    r = httpx.post(url + "/v1/chat/completions", json=body).json()
    assert r["usage"]["prompt_tokens"] == len(ids)
    same = {"model": "tools", "max_tokens": 12, "prompt": ids}
    c = httpx.post(url + "/v1/completions", json=same).json()
    assert r["usage"]["completion_tokens"] == c["usage"]["completion_tokens"]
    headed = httpx.post(url + "/v1/chat/completions", json={**body, "add_generation_prompt": True})
    assert headed.json()["usage"]["prompt_tokens"] > len(ids)
