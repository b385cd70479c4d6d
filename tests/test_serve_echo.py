"""A prompt's own log-probabilities: the library's `Pair.prompt_logprobs` and a completion's
`echo` (with `logprobs`, `max_tokens` 0 or more) through a real uvicorn server with the
official `openai` client, as an evaluation harness (lm-evaluation-harness's
`local-completions`) asks for a loglikelihood. The numbers are compared with the log-softmax
of the target's own forward over the whole prompt, within float tolerance (the scoring runs in
chunks: other matmul shapes)."""
# ruff: noqa: F811  (test_serve's fixtures, imported by name, are the tests' arguments)

from __future__ import annotations

import httpx
import mlx.core as mx
import numpy as np
import pytest
import tiny
from test_serve import EOS, client, make_tokenizer, metric, pair, running, url  # noqa: F401

from dflash2_mlx.api import Pair
from dflash2_mlx.engine.generation import GenerationParams
from dflash2_mlx.engine.scoring import PromptScoring
from dflash2_mlx.errors import ParameterError
from dflash2_mlx.serve import create_app

PROMPT = [3, 9, 4, 12, 7, 7, 30, 5, 18, 22, 9, 41, 6]


def reference(model, ids: list[int]) -> np.ndarray:
    """Row i: the target's log-probabilities after ids[: i + 1], one forward of all of them."""
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_prompt_logprobs_are_the_targets_own_in_any_chunking(family):
    """Every token after the first, scored by the tokens before it (the hybrid target's
    recurrent state carried across chunks), with its top alternatives."""
    model = tiny.make_target(family)
    pair = Pair.from_models(model, make_tokenizer(), tiny.make_drafter(2, block_size=4))
    ref = reference(model, PROMPT)
    for chunk in (4, 256):
        scored = PromptScoring(pair.decoder.target, PROMPT, top=3).run(chunk)
        assert [lp.token for lp in scored] == PROMPT[1:]
        got = [lp.logprob for lp in scored]
        np.testing.assert_allclose(got, [ref[i, t] for i, t in enumerate(PROMPT[1:])], atol=1e-3)
        for i, lp in enumerate(scored):
            np.testing.assert_allclose([v for _, v in lp.top], np.sort(ref[i])[::-1][:3], atol=1e-3)
    assert [lp.logprob for lp in pair.prompt_logprobs(PROMPT)] == pytest.approx(got, abs=1e-3)
    first = next(
        iter(pair.decoder.stream(PROMPT, GenerationParams(max_tokens=2, prompt_logprobs=0)))
    )
    assert [lp.logprob for lp in first.prompt_logprobs] == pytest.approx(got, abs=1e-3)
    with pytest.raises(ParameterError, match="out of range"):
        pair.prompt_logprobs([3, 10_000])
    with pytest.raises(ParameterError, match="empty"):
        pair.prompt_logprobs([])


def check_prompt_entries(pair, lp, text: str, ids: list[int], top: int):
    ref = reference(pair.model, ids)
    n = len(ids)
    assert lp.tokens[:n] == [pair.tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = [ref[i, t] for i, t in enumerate(ids[1:])]
    np.testing.assert_allclose(lp.token_logprobs[1:n], want, atol=1e-3)
    for i, alts in enumerate(lp.top_logprobs[1:n]):
        chosen = pair.tokenizer.decode([ids[i + 1]])
        assert alts[chosen] == lp.token_logprobs[i + 1]  # the chosen one is always there
        best = sorted(alts.values(), reverse=True)[:top]
        np.testing.assert_allclose(best, np.sort(ref[i])[::-1][: len(best)], atol=1e-3)
    for token, start in zip(lp.tokens[:n], lp.text_offset[:n]):
        assert text[start : start + len(token)] == token  # offsets point into the text


def test_echo_with_no_tokens_scores_the_prompt_alone(pair, client, url):
    before = httpx.get(url + "/metrics").text
    r = client.completions.create(model="tiny", prompt=PROMPT, echo=True, logprobs=2, max_tokens=0)
    after = httpx.get(url + "/metrics").text
    # its queue wait and scored prompt are counted (a generation with no prefill otherwise)
    for name, grew in [
        ("dflash2_queue_wait_seconds_count", 1),
        ("dflash2_scored_prompt_tokens_total", len(PROMPT)),
    ]:
        assert metric(after, name) - metric(before, name) == grew, name
    choice = r.choices[0]
    assert choice.text == pair.tokenizer.decode(PROMPT) and choice.finish_reason == "length"
    check_prompt_entries(pair, choice.logprobs, choice.text, PROMPT, 2)
    assert len(choice.logprobs.tokens) == len(PROMPT)
    assert r.usage.prompt_tokens == len(PROMPT) and r.usage.completion_tokens == 0
    before = httpx.get(url + "/metrics").text  # without logprobs: echoed, its wait counted
    client.completions.create(model="tiny", prompt=PROMPT, echo=True, max_tokens=0)
    waits = "dflash2_queue_wait_seconds_count"
    assert metric(httpx.get(url + "/metrics").text, waits) == metric(before, waits) + 1


def test_an_evaluation_harness_loglikelihood_batch(pair, client, url):
    """lm-evaluation-harness's request: token-id prompts (context + continuation) in one
    batch, echo, max_tokens 1, logprobs 1, temperature 0; it sums token_logprobs[ctxlen:-1]
    (the last entry is the generated token) and checks each against its top_logprobs' best."""
    contexts, continuations = [PROMPT[:6], PROMPT[:9]], [PROMPT[6:10], PROMPT[9:]]
    prompts = [c + x for c, x in zip(contexts, continuations)]
    body = dict(model="tiny", prompt=prompts, echo=True, max_tokens=1, logprobs=1, temperature=0)
    before = httpx.get(url + "/metrics").text
    r = client.completions.create(**body, seed=1234)
    waits = "dflash2_queue_wait_seconds_count"  # once a prompt: at its scoring, not again
    assert metric(httpx.get(url + "/metrics").text, waits) - metric(before, waits) == 2
    for choice, ctx, ids in zip(sorted(r.choices, key=lambda c: c.index), contexts, prompts):
        lp = choice.logprobs
        assert len(lp.tokens) == len(ids) + 1  # the prompt's entries, then the generated one
        check_prompt_entries(pair, lp, choice.text, ids, 1)
        ref = reference(pair.model, ids)
        want = sum(ref[i - 1, ids[i]] for i in range(len(ctx), len(ids)))
        assert sum(lp.token_logprobs[len(ctx) : -1]) == pytest.approx(want, abs=1e-3)
        alone = client.completions.create(model="tiny", prompt=ids, max_tokens=1, temperature=0)
        assert lp.tokens[-1] == alone.choices[0].text  # the engine's own greedy token
        assert choice.text == pair.tokenizer.decode(ids) + alone.choices[0].text


def test_a_reply_ended_by_its_stop_token_keeps_that_entry_after_the_prompt(pair, client):
    """The first generated token is the end of text (logit_bias): the text ends with the
    prompt, and the entries end with the stop token's, so dropping the last entry (the
    generated one) never drops a prompt token's."""
    kw = dict(model="tiny", prompt=PROMPT, echo=True, max_tokens=1, logprobs=1)
    r = client.completions.create(**kw, logit_bias={str(EOS): 100})
    lp = r.choices[0].logprobs
    assert r.choices[0].text == pair.tokenizer.decode(PROMPT)
    assert r.choices[0].finish_reason == "stop"
    assert len(lp.tokens) == len(PROMPT) + 1 and lp.token_logprobs[-1] > -1e-3
    assert lp.text_offset[-1] == len(r.choices[0].text)
    check_prompt_entries(pair, lp, r.choices[0].text, PROMPT, 1)
    # the same where a stop string the first generated token completes ends the reply
    first = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1).choices[0].text
    cut = client.completions.create(**kw, stop=[first]).choices[0]
    assert cut.text == pair.tokenizer.decode(PROMPT) and cut.finish_reason == "stop"
    assert cut.logprobs.tokens == lp.tokens[:-1] + [first]
    streamed = []
    for chunk in client.completions.create(**kw, logit_bias={str(EOS): 100}, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.tokens
    assert streamed == lp.tokens


def test_echo_streamed_equals_whole_and_the_completion_follows_the_prompt(pair, client):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    plain = client.completions.create(**kw).choices[0]
    whole = client.completions.create(**kw, echo=True, logprobs=0).choices[0]
    prompt_text = pair.tokenizer.decode(PROMPT)
    assert whole.text == prompt_text + plain.text
    lp = whole.logprobs
    check_prompt_entries(pair, lp, whole.text, PROMPT, 0)
    assert lp.text_offset[len(PROMPT)] == len(prompt_text)  # the completion's offsets follow
    text, tokens, values, offsets = "", [], [], []
    for chunk in client.completions.create(**kw, echo=True, logprobs=0, stream=True):
        if not chunk.choices:
            continue
        text += chunk.choices[0].text
        if chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    assert text == whole.text and tokens == lp.tokens and offsets == lp.text_offset
    assert values[0] is None
    np.testing.assert_allclose(values[1:], lp.token_logprobs[1:], atol=1e-5)
    no_lp = client.completions.create(**kw, echo=True)
    assert no_lp.choices[0].text == whole.text and no_lp.choices[0].logprobs is None


def test_echo_of_a_text_prompt_and_n_choices(pair, url):
    text = "abcab ba"
    body = dict(model="tiny", prompt=text, echo=True, max_tokens=0, logprobs=1, n=2)
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    ids = pair.tokenizer.encode(text)
    assert [c["text"] for c in r["choices"]] == [pair.tokenizer.decode(ids)] * 2
    assert r["choices"][0]["logprobs"] == r["choices"][1]["logprobs"]
    assert len(r["choices"][0]["logprobs"]["tokens"]) == len(ids)


def test_a_generation_scores_its_prompt_with_its_own_prefill(pair, monkeypatch):
    """GenerationParams.prompt_logprobs: the prefill's rows give the prompt's log-probabilities
    (the whole prompt fed again where a session holds part of it), and the reply is the one
    asked without them; the server's echo with max_tokens >= 1 reads its prompt once (a
    scoring pass of its own came first)."""
    from dflash2_mlx.serve import scheduler

    ref = reference(pair.model, PROMPT)
    plain = list(pair.decoder.stream(PROMPT, GenerationParams(max_tokens=6)))
    session = pair.decoder.new_session()
    list(pair.decoder.stream(PROMPT[:8], GenerationParams(max_tokens=2), session))
    for s in (None, session):
        events = list(
            pair.decoder.stream(PROMPT, GenerationParams(max_tokens=6, prompt_logprobs=2), s)
        )
        first = events[0]
        assert first.reused_tokens == 0 and first.prompt_tokens == len(PROMPT)
        assert [lp.token for lp in first.prompt_logprobs] == PROMPT[1:]
        got = [lp.logprob for lp in first.prompt_logprobs]
        np.testing.assert_allclose(got, [ref[i, t] for i, t in enumerate(PROMPT[1:])], atol=1e-3)
        assert all(len(lp.top) == 2 for lp in first.prompt_logprobs)
        assert sum((e.tokens for e in events), []) == sum((e.tokens for e in plain), [])
    assert plain[0].prompt_logprobs is None

    def no_second_pass(*args, **kwargs):
        raise AssertionError("a generation's prompt was scored by a pass of its own")

    monkeypatch.setattr(scheduler, "PromptScoring", no_second_pass)
    app = create_app(pair, model_name="tiny", default_max_tokens=4)
    with running(app) as base:
        body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 2, "temperature": 0}
        r = httpx.post(base + "/v1/completions", json=body)
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        np.testing.assert_allclose(
            lp["token_logprobs"][1 : len(PROMPT)],
            [ref[i, t] for i, t in enumerate(PROMPT[1:])],
            atol=1e-3,
        )
