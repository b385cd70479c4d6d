"""`dflash2 serve` with the prompt cache: a real uvicorn server on 127.0.0.1 and the official
openai client. A conversation's next turn prefills only its new tokens (usage reports the
cached ones) and answers exactly as a cold run; a hybrid (Gated-DeltaNet) target resumes at
the stored end of the previous prompt; concurrent requests sharing a prefix each get their own
exact answer; a small budget evicts, /metrics counts it all."""

from __future__ import annotations

import re

import threading

import httpx
import openai
import pytest
import tiny
from test_serve import HI, make_tokenizer, metric, reference, running

from dflash2_mlx.api import Pair
from dflash2_mlx.engine.prompt_cache import common_prefix
from dflash2_mlx.serve import create_app
from dflash2_mlx.text import chat_prompt_ids

N = 10


def serve(family: str, prompt_cache_mb: int, **kw):
    pair = Pair.from_models(
        tiny.make_target(family), make_tokenizer(), tiny.make_drafter(2, block_size=4)
    )
    app = create_app(
        pair,
        model_name="tiny",
        default_max_tokens=N,
        drafter_name="tiny-dflash2",
        prompt_cache_mb=prompt_cache_mb,
        **kw,
    )
    return pair, running(app)


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client, messages, **kw):
    return client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=N, temperature=0, **kw
    )


def cached(usage) -> int:
    assert (
        usage.model_extra["dflash2"]["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
    )
    return usage.prompt_tokens_details.cached_tokens


def turn2(answer: str, question: str = "And then?") -> list[dict]:
    return HI + [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_second_turn_prefills_only_new_tokens(family):
    pair, server = serve(family, 64)
    with server as url:
        client = client_for(url)
        first = ask(client, HI)
        assert cached(first.usage) == 0
        messages = turn2(first.choices[0].message.content)
        ids = chat_prompt_ids(pair.tokenizer, messages)
        second = ask(client, messages)
        # At least the whole first prompt is resumed (the answer too where its re-rendering
        # matches the generated tokens); the answer is the cold run's.
        assert len(chat_prompt_ids(pair.tokenizer, HI)) <= cached(second.usage) < len(ids)
        assert second.usage.prompt_tokens == len(ids)
        assert second.choices[0].message.content == reference(pair, ids, N)[0]
        # Streaming reports it in the usage chunk too.
        chunks = list(
            ask(
                client,
                turn2(first.choices[0].message.content, "Why?"),
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert cached(chunks[-1].usage) >= len(chat_prompt_ids(pair.tokenizer, HI))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        why = chat_prompt_ids(pair.tokenizer, turn2(first.choices[0].message.content, "Why?"))
        assert text == reference(pair, why, N)[0]
        body = httpx.get(url + "/metrics").text
        assert metric(body, "dflash2_cached_prompt_tokens_total") == cached(second.usage) + cached(
            chunks[-1].usage
        )
        assert metric(body, "dflash2_prompt_cache_hits_total") == 2
        assert metric(body, "dflash2_prompt_cache_misses_total") == 1
        assert 0 < metric(body, "dflash2_prompt_cache_bytes") <= 64 << 20
        card = client.models.retrieve("tiny").model_extra["dflash2"]
        assert card["prompt_cache_mb"] == 64


def test_a_hybrid_targets_conversations_sharing_a_system_prompt_resume_at_it():
    """An agent opens each conversation with the same long system prompt (and tools): a
    hybrid target's recurrent state cannot roll back to it, so each prefilled it all again.
    The state where another conversation with the same system messages would branch off is
    kept on the way: the next conversations resume there."""
    from dflash2_mlx.engine.prompt_cache import BRANCH_MIN_TOKENS

    system = "You are a careful agent. Use the tools below. " * 8
    pair, server = serve("qwen3_5", 64)
    with server as url:
        client = client_for(url)
        convs = [
            [{"role": "system", "content": system}, {"role": "user", "content": q}]
            for q in ("List files", "Read the README", "Run the tests")
        ]
        first, second = (chat_prompt_ids(pair.tokenizer, c) for c in convs[:2])
        shared = common_prefix(first, second, len(second))
        assert shared >= BRANCH_MIN_TOKENS
        for i, conv in enumerate(convs):
            reply = ask(client, conv)
            ids = chat_prompt_ids(pair.tokenizer, conv)
            assert cached(reply.usage) == (shared if i else 0), i
            assert reply.choices[0].message.content == reference(pair, ids, N)[0]


def ask_together(client, convs: list) -> list:
    """Each conversation asked from its own thread, all at once; their replies in order."""
    results: list = [None] * len(convs)

    def go(i):
        results[i] = ask(client, convs[i])

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(convs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_concurrent_requests_sharing_a_prefix():
    # One at a time, so each request leases after the one before stored its session (batched,
    # requests that continue one conversation at the same moment: the first takes its entry
    # and the others miss, whichever the timing makes first).
    pair, server = serve("llama", 64, max_batch=1)
    with server as url:
        client = client_for(url)
        answer = ask(client, HI).choices[0].message.content
        convs = [
            turn2(answer),
            turn2(answer),
            turn2(answer, "Other?"),
            [{"role": "user", "content": "Hi where"}],
        ]
        results = ask_together(client, convs)
        for conv, r in zip(convs, results):
            ids = chat_prompt_ids(pair.tokenizer, conv)
            assert r.choices[0].message.content == reference(pair, ids, N)[0]
        assert sum(cached(r.usage) > 0 for r in results) >= 3  # the branch shares "Hi"


def test_concurrent_continuations_in_one_batch_stay_exact():
    """Batched, requests that continue one conversation at the same moment race for its entry
    (one takes it; the others may miss): every answer is still the cold run's."""
    pair, server = serve("llama", 64, max_batch=4)
    with server as url:
        client = client_for(url)
        answer = ask(client, HI).choices[0].message.content
        convs = [turn2(answer), turn2(answer), turn2(answer, "Other?")]
        results = ask_together(client, convs)
        for conv, r in zip(convs, results):
            ids = chat_prompt_ids(pair.tokenizer, conv)
            assert r.choices[0].message.content == reference(pair, ids, N)[0]
        assert sum(cached(r.usage) > 0 for r in results) >= 1  # the entry served one at least


def test_small_budget_evicts_and_zero_turns_it_off():
    pair, server = serve("llama", 1)
    with server as url:
        client = client_for(url)
        for i in range(6):
            conv = [{"role": "user", "content": f"Conversation {i} " + "x" * 300}]
            r = ask(client, conv)
            assert (
                r.choices[0].message.content
                == reference(pair, chat_prompt_ids(pair.tokenizer, conv), N)[0]
            )
        body = httpx.get(url + "/metrics").text
        assert metric(body, "dflash2_prompt_cache_evictions_total") >= 1
        assert metric(body, "dflash2_prompt_cache_bytes") <= 1 << 20
    pair, server = serve("llama", 0)
    with server as url:
        client = client_for(url)
        answer = ask(client, HI).choices[0].message.content
        r = ask(client, turn2(answer))
        assert cached(r.usage) == 0
        body = httpx.get(url + "/metrics").text
        assert re.search(r"^dflash2_prompt_cache_hits_total 0$", body, re.M)  # off: reads 0


def test_a_request_refused_as_it_joins_keeps_the_conversation_cached(monkeypatch):
    """A request the engine refuses before its prefill began (a ParameterError at `add`)
    hands its leased conversation back untouched: the next turn still resumes it."""
    from dflash2_mlx import ParameterError

    pair, server = serve("llama", 64)
    with server as url:
        client = client_for(url)
        first = ask(client, HI)
        messages = turn2(first.choices[0].message.content)
        validate = pair.decoder._validate

        def refuse_once(prompt, params):
            monkeypatch.setattr(pair.decoder, "_validate", validate)
            raise ParameterError("refused for this test")

        monkeypatch.setattr(pair.decoder, "_validate", refuse_once)
        with pytest.raises(openai.BadRequestError, match="refused for this test"):
            ask(client, messages)
        second = ask(client, messages)
        assert cached(second.usage) >= len(chat_prompt_ids(pair.tokenizer, HI))
