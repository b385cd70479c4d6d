"""Constrained generation: the output is exactly plain decoding over the masked logits.

A constraint (engine/constraint.py) masks the verify forward's logits row by row, each row
after its own prefix of drafts. Checked against one-token-at-a-time decoding that masks the
same way, on dense and hybrid targets, alone and batched, with drafts accepted (the
prediction proposes the reference itself, so later rows' masks decide) and refused; sampled
output follows the masked distribution; JSON schemas through llguidance.
"""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
import tiny
from mlx_lm.models.cache import make_prompt_cache
from test_sampling import PROMPT, V, empirical, tv

from dflash2_mlx import GenerationParams, ParameterError, SamplingParams, SpeculativeDecoder
from dflash2_mlx.api import Pair
from dflash2_mlx.sampling import filtered_probs
from dflash2_mlx.target.adapter import TargetAdapter

PROMPTS = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 2, 7, 1, 8]]


class Modular:
    """After a token `last`, the tokens t with (t + last) % k != 0 are allowed: a stateful
    constraint whose every row depends on the draft before it."""

    def __init__(self, vocab: int, last: int, k: int = 3):
        self.vocab, self.last, self.k = vocab, last, k
        self.committed: list[int] = []

    def _row(self, last: int) -> np.ndarray:
        return (np.arange(self.vocab) + last) % self.k != 0

    def allowed(self, drafts):
        lasts = [self.last] + list(drafts)
        return np.stack([self._row(t) for t in lasts])

    def commit(self, tokens):
        self.committed += list(tokens)
        if tokens:
            self.last = tokens[-1]

    def forced(self):
        return []


class Chain(Modular):
    """Modular, except that after a multiple of 4 the next `run` tokens are forced: t, t + 1,
    ... (mod the vocabulary), each the only one allowed; `forced` spells them."""

    def __init__(self, vocab: int, last: int, run: int = 5):
        super().__init__(vocab, last)
        self.run, self.left = run, run if last % 4 == 0 else 0

    def _rows(self, drafts):
        last, left = self.last, self.left
        for t in [None] + list(drafts):
            if t is not None:
                left = left - 1 if left else (self.run if t % 4 == 0 else 0)
                last = t
            if left:
                row = np.zeros(self.vocab, bool)
                row[(last + 1) % self.vocab] = True
                yield row
            else:
                yield self._row(last)

    def allowed(self, drafts):
        return np.stack(list(self._rows(drafts)))

    def commit(self, tokens):
        for t in tokens:
            self.left = self.left - 1 if self.left else (self.run if t % 4 == 0 else 0)
        super().commit(tokens)

    def forced(self):
        return [(self.last + 1 + i) % self.vocab for i in range(self.left)]


def reference(model, prompt, n, constraint) -> list[int]:
    """Plain decoding, one token per forward, argmax over the masked logits."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)
    out: list[int] = []
    while len(out) < n:
        row = mx.array(constraint.allowed([])[0])
        tok = int(mx.argmax(mx.where(row, logits[0, -1], -mx.inf)).item())
        out.append(tok)
        constraint.commit([tok])
        logits = model(mx.array([[tok]]), cache=cache)
    return out


def modular(prompt):
    return lambda: Modular(tiny.VOCAB, prompt[-1])


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen3_5"])
def decoder(request):
    model = tiny.make_target(request.param)
    drafter = tiny.make_drafter(2)
    return model, SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)


def test_constrained_greedy_equals_plain_constrained_decoding(decoder):
    model, dec = decoder
    for prompt in PROMPTS:
        ref = reference(model, prompt, 24, Modular(tiny.VOCAB, prompt[-1]))
        free = tiny.greedy_reference(model, prompt, 24)
        assert ref != free, "the constraint should change the output"
        # A prediction of the reference is accepted through many rows (each row's own mask
        # decides); one with a forbidden token in it is refused there.
        bad = ref[:5] + [next(t for t in range(tiny.VOCAB) if (t + ref[4]) % 3 == 0)] + ref[6:]
        for block, predicted in ((2, ()), (5, ()), (8, ()), (4, tuple(ref)), (4, tuple(bad))):
            params = GenerationParams(
                max_tokens=24, block_size=block, prediction=predicted, constraint=modular(prompt)
            )
            events = list(dec.stream(prompt, params))
            out = [t for ev in events for t in ev.tokens]
            assert out == ref, (block, predicted == tuple(ref), prompt)
            if predicted == tuple(ref):
                assert max(ev.accepted for ev in events) >= 8


def test_forced_text_is_proposed_and_accepted(decoder):
    """What the constraint forces is drafted ("grammar" rounds, no draft pass) and accepted
    whole; the output is still plain decoding over the masked logits."""
    model, dec = decoder
    for prompt in PROMPTS:
        ref = reference(model, prompt, 30, Chain(tiny.VOCAB, prompt[-1]))
        params = GenerationParams(
            max_tokens=30, block_size=4, constraint=lambda p=prompt: Chain(tiny.VOCAB, p[-1])
        )
        events = list(dec.stream(prompt, params))
        assert [t for ev in events for t in ev.tokens] == ref
        forced = [ev for ev in events if ev.source == "grammar"]
        assert forced and all(ev.accepted == ev.drafted for ev in forced)
        assert max(ev.drafted for ev in forced) >= 4


def test_every_committed_token_reaches_the_constraint(decoder):
    model, dec = decoder
    made = []

    def factory():
        made.append(Modular(tiny.VOCAB, PROMPTS[0][-1]))
        return made[-1]

    out = dec.generate(PROMPTS[0], GenerationParams(max_tokens=20, constraint=factory))
    assert len(made) == 1 and made[0].committed == out


def test_a_stop_token_is_not_passed_to_the_constraint(decoder):
    model, dec = decoder
    ref = reference(model, PROMPTS[1], 20, Modular(tiny.VOCAB, PROMPTS[1][-1]))
    stop = ref[6]
    made = []

    def factory():
        made.append(Modular(tiny.VOCAB, PROMPTS[1][-1]))
        return made[-1]

    params = GenerationParams(max_tokens=20, stop_token_ids=frozenset({stop}), constraint=factory)
    out = dec.generate(PROMPTS[1], params)
    assert out == ref[: ref.index(stop) + 1]
    assert made[0].committed == out[:-1]


def test_batched_rows_each_follow_their_own_constraint(decoder):
    model, dec = decoder
    pair = Pair(model, None, dec.drafter, dec)
    prompts = PROMPTS + [[7, 7, 1, 2]]
    expected = [
        reference(model, prompts[0], 16, Modular(tiny.VOCAB, PROMPTS[0][-1])),
        tiny.greedy_reference(model, prompts[1], 12),
        reference(model, prompts[2], 20, Modular(tiny.VOCAB, 2, k=2)),
    ]
    params = [  # the first row's prediction is accepted through many rows of its masks
        GenerationParams(
            max_tokens=16, prediction=tuple(expected[0]), constraint=modular(PROMPTS[0])
        ),
        GenerationParams(max_tokens=12),
        GenerationParams(max_tokens=20, constraint=lambda: Modular(tiny.VOCAB, 2, k=2)),
    ]
    results = pair.generate_batch(prompts, params, max_batch=3)
    assert [out for out, _ in results] == expected
    assert results[0][1].accepted >= 8


def exact_masked_marginals(model, sp: SamplingParams, prompt=PROMPT):
    """Exact P(t1), P(t2) after `prompt` when each token must satisfy Modular (k=3)."""

    def masked(logits, last):
        keep = (mx.arange(V)[None, :] + mx.array(last)[:, None]) % 3 != 0
        return filtered_probs(mx.where(keep, logits, -mx.inf), sp)

    p1 = np.array(masked(model(mx.array([prompt]))[:, -1], [prompt[-1]]))[0]
    seq2 = mx.array([prompt + [a] for a in range(V)])
    p2 = np.array(masked(model(seq2)[:, -1], list(range(V))))
    return p1, (p1[:, None] * p2).sum(0)


@pytest.mark.slow
def test_constrained_sampling_follows_the_masked_distribution():
    model = tiny.make_target("llama", vocab=V, seed=11)
    drafter = tiny.make_drafter(2, vocab=V, mask_token_id=V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    sp = SamplingParams(temperature=1.0)

    constrained = _with_constraint(dec, lambda: Modular(V, PROMPT[-1]))
    emp = empirical(constrained, sp, 1000)
    exact = exact_masked_marginals(model, sp)
    for i in range(2):
        assert tv(emp[i], exact[i]) < 0.09, (i, tv(emp[i], exact[i]))
        assert emp[i][exact[i] == 0].sum() == 0  # a forbidden token is never drawn


def _with_constraint(dec, factory):
    """`dec`, whose every generation takes the constraint `factory` (test_sampling's
    `empirical` builds its own GenerationParams)."""

    class Constrained:
        def generate(self, prompt, params):
            return dec.generate(prompt, replace(params, constraint=factory))

    return Constrained()


# ------------------------------------------------------------------ JSON schemas (llguidance)
MOOD = {
    "type": "object",
    "properties": {"mood": {"enum": ["happy", "sad", "calm"]}, "ok": {"type": "boolean"}},
    "required": ["mood", "ok"],
    "additionalProperties": False,
}


CHARS = 100  # 3 specials, 96 printable characters, the mask


@pytest.fixture(scope="module")
def char_pair():
    """A tiny llama with test_serve's one-token-per-character tokenizer over every printable
    ASCII character (so it can spell JSON)."""
    from test_serve import make_tokenizer

    return Pair.from_models(
        tiny.make_target("llama", vocab=CHARS),
        make_tokenizer(CHARS),
        tiny.make_drafter(2, block_size=4, vocab=CHARS, mask_token_id=CHARS - 1),
    )


def test_json_schema_reply_is_valid_and_exact(char_pair):
    ids = char_pair.tokenizer.encode("Answer in JSON: how are you?")
    grammar = char_pair.json_schema(MOOD)
    plain, _ = char_pair.generate(
        ids, GenerationParams(max_tokens=400, speculative=False, constraint=grammar)
    )
    assert plain[-1] in char_pair.eos_ids, "a finished value allows only the stop tokens"
    value = json.loads(char_pair.tokenizer.decode(plain[:-1]))
    assert value["mood"] in ("happy", "sad", "calm") and isinstance(value["ok"], bool)
    assert set(value) == {"mood", "ok"}
    for predicted in ((), tuple(plain)):
        params = GenerationParams(max_tokens=400, prediction=predicted, constraint=grammar)
        out, stats = char_pair.generate(ids, params)
        assert out == plain
    assert stats.accepted > 0
    any_object, _ = char_pair.generate(
        ids, GenerationParams(max_tokens=60, constraint=char_pair.json_schema())
    )
    assert char_pair.tokenizer.decode(any_object).lstrip().startswith("{")


@pytest.mark.parametrize("lookup_block", [3, 4, 8])
def test_a_round_that_drafts_the_end_and_the_stop_token_stays_exact(char_pair, lookup_block):
    """A proposal that closes the value and stops (brace, stop token) while plain decoding
    still writes whitespace: the brace is refused, and the grammar must be where it was
    (llguidance does not count a consumed stop token for a rollback)."""
    tok = char_pair.tokenizer
    ids = tok.encode("Answer in JSON: how are you?")
    grammar = char_pair.json_schema(MOOD)
    plain, _ = char_pair.generate(
        ids, GenerationParams(max_tokens=400, speculative=False, constraint=grammar)
    )
    text = tok.decode(plain[:-1])  # one token per character
    value_end = max(text.rfind("true"), text.rfind("false") + 1) + 4
    spaces = len(text[value_end:]) - len(text[value_end:].lstrip())
    assert spaces >= 2, "the premise: plain decoding writes whitespace before the brace"
    (brace,), (eos,) = tok.encode("}"), char_pair.eos_ids
    predicted = tuple(plain[: value_end + min(5, spaces - 1)]) + (brace, eos)
    params = GenerationParams(
        max_tokens=400, prediction=predicted, lookup_block=lookup_block, constraint=grammar
    )
    assert char_pair.generate(ids, params)[0] == plain


def test_drafts_past_the_stop_token_leave_the_grammar_where_it_was(char_pair):
    tok = char_pair.tokenizer
    c = char_pair.json_schema(MOOD)()
    c.commit(tok.encode('{"mood":"sad","ok":true'))
    before = c.allowed([])[0]
    (brace,), (eos,) = tok.encode("}"), char_pair.eos_ids
    rows = c.allowed([brace, eos, brace])
    assert rows.shape[0] == 4 and rows[1][eos] and not rows[0][eos]
    assert (c.allowed([])[0] == before).all()
    c.commit([brace])
    assert c.allowed([])[0][eos]


def test_a_constraint_whose_stop_tokens_do_not_stop_is_refused(char_pair):
    grammar = char_pair.json_schema(MOOD)
    params = GenerationParams(max_tokens=20, stop_token_ids=frozenset({1}), constraint=grammar)
    with pytest.raises(ParameterError, match="stop_token_ids must include"):  # the exact ids
        char_pair.decoder.generate([5, 6, 7], params)
    assert char_pair.with_defaults(params).stop_token_ids >= char_pair.eos_ids  # a pair's add


@pytest.mark.parametrize(
    "schema,needle",
    [({"type": "strin"}, "strin"), ({"type": "object", "properties": 3}, "properties")],
)
def test_a_schema_llguidance_cannot_compile_is_a_parameter_error(char_pair, schema, needle):
    with pytest.raises(ParameterError, match="JSON schema") as err:
        char_pair.json_schema(schema)
    assert needle in str(err.value)


@pytest.mark.real_model
def test_json_schema_on_the_embedded_smollm2(tmp_path_factory):
    """The real tokenizer (byte-level BPE, read by llguidance from its Rust definition) and
    the shipped drafter: a finished, valid value, exactly plain constrained decoding's."""
    from mlx_lm import load
    from smollm2 import any_conversion

    from dflash2_mlx import load_drafter
    from dflash2_mlx.registry import EMBEDDED_DRAFTER
    from dflash2_mlx.text import chat_prompt_ids

    model, tokenizer = load(str(any_conversion(tmp_path_factory)))
    pair = Pair.from_models(model, tokenizer, load_drafter(EMBEDDED_DRAFTER, dtype=mx.float32))
    ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": "How are you? Reply in JSON."}])
    grammar = pair.json_schema(MOOD)
    plain, _ = pair.generate(
        ids, GenerationParams(max_tokens=48, speculative=False, constraint=grammar)
    )
    out, stats = pair.generate(ids, GenerationParams(max_tokens=48, constraint=grammar))
    assert out == plain and out[-1] in pair.eos_ids
    value = json.loads(tokenizer.decode(out[:-1]))
    assert value["mood"] in ("happy", "sad", "calm") and isinstance(value["ok"], bool)
    assert stats.grammar_rounds > 0  # the rest of the keys is forced text, drafted for free


# Rounds of a json_object reply on SmolLM2 (its drafts, then what each round committed) after
# which llguidance's rollback left the mask allowing `",` after `{"` (an empty key, then a
# comma), which consume_token then refused: the server answered 500 (pydantic-ai's prompt).
JSON_ROUNDS = [
    ([], ['{"']),
    ([" is", " {", " city"], ["properties"]),
    (
        [
            '":',
            ' {"',
            "name",
            '":',
            ' {"',
            "max",
            "Length",
            '":',
            " ",
            "2",
            "0",
            ",",
            ' "',
            "type",
            '":',
        ],
        ['":', '{"'],
    ),
    (['",', ' "', '":'], ["name"]),
    (['":', ' "', "1"], ['":', '{"']),
    (['",', ' "', '":'], []),
]


@pytest.mark.real_model
def test_a_draft_walk_leaves_the_grammar_as_it_was(tmp_path_factory):
    """Each round's masks are those of a matcher that never walked drafts (exact: the same
    grammar at the same tokens)."""
    from smollm2 import any_conversion
    from transformers import AutoTokenizer

    from dflash2_mlx.grammar import Grammars

    hf = AutoTokenizer.from_pretrained(str(any_conversion(tmp_path_factory)))
    grammar = Grammars(hf, len(hf), [hf.eos_token_id]).json_schema(None)

    def ids(pieces):
        out = [hf.convert_tokens_to_ids(hf.tokenize(p)) for p in pieces]
        assert all(len(i) == 1 for i in out), pieces
        return [i[0] for i in out]

    walked, committed = grammar(), []
    for drafts, commit in JSON_ROUNDS:
        rows = walked.allowed(ids(drafts))
        fresh = grammar()
        fresh.commit(committed)
        assert (rows[0] == fresh.allowed([])[0]).all()
        walked.commit(ids(commit))
        committed += ids(commit)
    assert not rows[0][ids(['",'])[0]]


class _RefusingMatcher:
    """A matcher whose mask allows every token and which refuses `refused` anyway."""

    def __init__(self, refused: int):
        self.refused = refused

    def deep_copy(self):
        return _RefusingMatcher(self.refused)

    def compute_bitmask(self) -> bytes:
        return bytes([0xFF]) * 2  # 16 tokens, all allowed

    def consume_token(self, t: int) -> bool:
        return t != self.refused

    def get_error(self) -> str:
        return "refused"


def test_a_draft_the_mask_allows_and_the_matcher_refuses_is_not_chosen():
    from dflash2_mlx.grammar import GrammarConstraint

    rows = GrammarConstraint(_RefusingMatcher(5), frozenset({0})).allowed([3, 5, 7])
    assert rows.shape == (4, 16) and rows[0].all()
    assert not rows[1][5] and rows[1].sum() == 15  # out of the row the verify chooses from


@pytest.fixture(scope="module")
def qwen_like(tmp_path_factory):
    """SmolLM2's byte-level BPE tokenizer with Qwen's markers added as single, non-special
    tokens (as Qwen2.5/3 have them; llguidance counts them as special all the same)."""
    from smollm2 import any_conversion
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from dflash2_mlx.grammar import Grammars

    hf = AutoTokenizer.from_pretrained(str(any_conversion(tmp_path_factory)))
    markers = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
    hf.add_tokens([AddedToken(m, special=False, normalized=False) for m in markers])
    return hf, Grammars(hf, len(hf), [hf.eos_token_id])


def _accepts(grammar, hf, text: str) -> bool:
    """The whole text (as the tokenizer splits it) is allowed and completes the reply."""
    m = grammar().matcher
    ids = hf.encode(text, add_special_tokens=False)
    return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


@pytest.mark.real_model
def test_reply_grammars_on_a_real_tokenizer_with_marker_tokens(qwen_like):
    from dflash2_mlx.grammar import Calls, Thinking

    hf, grammars = qwen_like
    assert len(hf.encode("<think>", add_special_tokens=False)) == 1
    ok = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    think = grammars.json_schema(ok, Thinking("<think>", "</think>"))
    assert _accepts(think, hf, '<think>\nhmm, {"ok" is it}\n</think>\n\n{"ok": true}')
    assert _accepts(think, hf, '{"ok": false}')
    assert not _accepts(think, hf, "<think>x</think> no json")
    opened = grammars.json_schema(ok, Thinking("<think>", "</think>", opened=True))
    assert _accepts(opened, hf, 'so: yes</think>\n{"ok": true}')
    loc = {
        "$defs": {"Loc": {"type": "object", "properties": {"city": {"enum": ["rome"]}}}},
        "type": "object",
        "properties": {"loc": {"$ref": "#/$defs/Loc"}},
        "required": ["loc"],
        "additionalProperties": False,
    }
    calls = grammars.reply(None, Calls("<tool_call>", "</tool_call>", (("f", loc), ("g", None))))
    call = '<tool_call>\n{"name": "f", "arguments": {"loc": {"city": "rome"}}}\n</tool_call>'
    assert _accepts(calls, hf, call)
    assert _accepts(calls, hf, "Let me look." + call + "\n" + call.replace('"f"', '"g"'))
    assert _accepts(calls, hf, "no call at all")
    assert not _accepts(calls, hf, call.replace("rome", "oslo"))  # f's arguments are strict
    assert not _accepts(calls, hf, call.replace('"f"', '"h"'))  # no such tool
    # a forced tool_choice: the prompt opened the call; the reply goes on from inside it
    opening = tuple(hf.encode('<tool_call>\n{"name":', add_special_tokens=False))
    forced = grammars.reply(
        None, Calls("<tool_call>", "</tool_call>", (("f", loc),), True, opening)
    )
    assert _accepts(forced, hf, ' "f", "arguments": {"loc": {"city": "rome"}}}\n</tool_call>')
    assert not _accepts(forced, hf, ' "f", "arguments": {"loc": {"city": "oslo"}}}</tool_call>')
    assert not _accepts(forced, hf, " no call")
    with pytest.raises(ParameterError, match=r"\$ref"):
        root = {"type": "object", "properties": {"kids": {"items": {"$ref": "#"}}}}
        grammars.reply(None, Calls("<tool_call>", "</tool_call>", (("f", root),)))


@pytest.mark.real_model
def test_times_are_held_to_seconds_a_clock_shows(qwen_like):
    """llguidance's time and date-time formats take second 60 at any hour, which pydantic and
    Python's datetime refuse: a reply "12:30:60Z" came back as a finished, valid-looking value."""
    hf, grammars = qwen_like
    for fmt, ok, bad in (
        ("time", "12:30:59Z", "12:30:60Z"),
        ("date-time", "2024-05-01T23:59:59.5+02:00", "2024-05-01T12:30:60Z"),
    ):
        schema = {"type": "object", "properties": {"t": {"type": "string", "format": fmt}}}
        assert _accepts(grammars.json_schema(schema), hf, f'{{"t": "{ok}"}}')
        assert not _accepts(grammars.json_schema(schema), hf, f'{{"t": "{bad}"}}')
    from dflash2_mlx.json_schema import closed_objects

    mine = {"type": "string", "format": "time", "pattern": "^1"}  # the schema's own stays
    assert closed_objects(mine) == mine


@pytest.mark.real_model
def test_formats_llguidance_does_not_know_are_notes(qwen_like):
    """JSON Schema's format is an annotation where a validator does not know it: pydantic's
    SecretStr ("password"), bytes ("binary") and Path ("path") were a 400; now their strings go
    unchecked, and the formats llguidance knows (email) are still enforced."""
    hf, grammars = qwen_like
    props = {k: {"type": "string", "format": f} for k, f in (("p", "password"), ("e", "email"))}
    schema = {"type": "object", "properties": props, "required": ["p", "e"]}
    assert _accepts(grammars.json_schema(schema), hf, '{"p": "any text", "e": "a@b.co"}')
    assert not _accepts(grammars.json_schema(schema), hf, '{"p": "any text", "e": "no"}')


@pytest.mark.real_model
def test_numbers_take_at_most_16_digits_and_10_decimals(qwen_like):
    """A small model's number that never ends (`"population": 1111…`, `0.0000…`) ran to
    max_tokens, or the end of the context when the client sent none (instructor, pydantic-ai
    and litellm send none): numbers the schema leaves unbounded take 16 integer digits at most
    (as llama.cpp's) and 10 decimals; a schema's own bounds stay."""
    from dflash2_mlx.json_schema import closed_objects

    hf, grammars = qwen_like
    for kind, most in (("integer", str(2**53 - 1)), ("number", "9" * 16)):
        g = grammars.json_schema({"type": "object", "properties": {"n": {"type": kind}}})
        assert _accepts(g, hf, '{"n": ' + most + "}")
        assert _accepts(g, hf, '{"n": -' + most + "}")
        assert not _accepts(g, hf, '{"n": ' + "9" * 17 + "}")
    g = grammars.json_schema({"type": "object", "properties": {"x": {"type": ["number", "null"]}}})
    assert _accepts(g, hf, '{"x": 3.1415926535}') and _accepts(g, hf, '{"x": null}')
    assert not _accepts(g, hf, '{"x": 3.14159265358}')  # 11 decimals
    own = {"type": "integer", "minimum": 0, "exclusiveMaximum": 10**15}
    assert closed_objects(own) == own  # bounded by the schema: left as it is
    with pytest.raises(ValueError, match="numbers are held within"):  # none would be left
        closed_objects({"type": "number", "minimum": 1e20})
    for given in (  # values from elsewhere: an enum, a const, a combinator
        {"type": "integer", "enum": [10**17, 5]},
        {"type": "number", "const": 3.14159265358979},
        {"type": "integer", "allOf": [{"minimum": 10**17}]},
    ):
        assert closed_objects(given) == given
    small = {"type": "number", "exclusiveMinimum": 0, "maximum": 5e-11}
    assert closed_objects(small) == small  # bounded: its decimals are its own


@pytest.mark.real_model
def test_a_map_keyed_by_an_enum_takes_those_keys(qwen_like):
    """pydantic writes dict[Literal["math", "art"], int] (or an Enum's keys) as `propertyNames`,
    which llguidance refuses (a 400 for instructor and pydantic-ai users): it is the object
    with those keys as optional properties and no others."""
    hf, grammars = qwen_like
    literal = {"type": "object", "additionalProperties": {"type": "integer"}}
    literal["propertyNames"] = {"enum": ["math", "art"]}
    by_ref = {
        "type": "object",
        "properties": {"m": {**literal, "propertyNames": {"$ref": "#/$defs/Subject"}}},
        "$defs": {"Subject": {"type": "string", "enum": ["math", "art"]}},
    }
    for schema, wrap in ((literal, "{}"), (by_ref, '{{"m": {}}}')):
        g = grammars.json_schema(schema)
        assert _accepts(g, hf, wrap.format('{"math": 3, "art": 4}'))
        assert _accepts(g, hf, wrap.format('{"art": 4}'))
        assert not _accepts(g, hf, wrap.format('{"music": 4}'))
        assert not _accepts(g, hf, wrap.format('{"art": "a"}'))


@pytest.mark.real_model
def test_objects_hold_the_keys_their_schema_lists(qwen_like):
    """An object schema with `properties` and nothing said of other keys takes no others (what
    OpenAI's strict mode means; llama.cpp and XGrammar do it by default): a small model cannot
    add keys until max_tokens cuts the JSON. `additionalProperties: true` still allows them."""
    from dflash2_mlx.json_schema import closed_objects

    hf, grammars = qwen_like
    person = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert _accepts(grammars.json_schema(person), hf, '{"name": "Al"}')
    assert not _accepts(grammars.json_schema(person), hf, '{"name": "Al", "age": 3}')
    open_person = {**person, "additionalProperties": True}
    assert _accepts(grammars.json_schema(open_person), hf, '{"name": "Al", "age": 3}')
    assert _accepts(grammars.json_schema(), hf, '{"any": ["thing"]}')  # json_object: any object
    # names that are keywords stay names; data is left as it is
    tricky = {"properties": {"properties": {"type": "string"}}, "const": {"properties": {}}}
    assert closed_objects(tricky) == {**tricky, "additionalProperties": False}
    # objects other schemas add keys to stay open: an allOf "extends", anyOf variants
    base = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    extends = {
        "type": "object",
        "allOf": [{"$ref": "#/$defs/Base"}],
        "properties": {"extra": {"type": "integer"}},
        "required": ["extra"],
        "$defs": {"Base": base},
    }
    assert _accepts(grammars.json_schema(extends), hf, '{"id": 1, "extra": 2}')
    variants = {
        "type": "object",
        "properties": {"k": {"type": "integer"}},
        "required": ["k"],
        "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"required": []}],
    }
    assert _accepts(grammars.json_schema(variants), hf, '{"k": 1, "a": 2}')
    union = {"anyOf": [person, {**base, "title": "B"}]}  # whole objects: each one closed
    assert not _accepts(grammars.json_schema(union), hf, '{"name": "Al", "x": 1}')


def test_dates_are_days_a_calendar_has(char_pair):
    """llguidance's date formats (and ours before) took 2023-02-30 and 2023-04-31, which
    pydantic and Python's datetime refuse: days by month, February 29 in leap years only."""
    tok = char_pair.tokenizer
    for fmt, tail in (("date", ""), ("date-time", "T10:00:00Z")):
        g = char_pair.grammars.json_schema({"type": "string", "format": fmt})
        for day in ("2024-02-29", "2000-02-29", "2023-01-31", "2023-04-30", "0001-01-01"):
            assert _accepts(g, tok, f'"{day}{tail}"'), day
        for day in ("2023-02-29", "1900-02-29", "2023-02-30", "2023-04-31", "0000-01-01"):
            assert not _accepts(g, tok, f'"{day}{tail}"'), day


def test_integers_left_open_stay_within_what_a_double_holds(char_pair):
    """The open sides of an integer take at most 2**53 - 1: 10**16 - 1 was a double's 1e16,
    which let 17-digit replies through."""
    tok = char_pair.tokenizer
    g = char_pair.grammars.json_schema({"type": "integer"})
    assert _accepts(g, tok, str(2**53 - 1)) and _accepts(g, tok, str(-(2**53) + 1))
    assert not _accepts(g, tok, str(2**53)) and not _accepts(g, tok, str(10**16))


def test_a_key_required_but_not_listed_is_allowed_in_a_closed_object(char_pair):
    """`required` naming a key `properties` does not list: any value there (JSON Schema's
    open objects allow it), not a 400 calling the user's schema unsatisfiable."""
    tok = char_pair.tokenizer
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    g = char_pair.grammars.json_schema(schema)
    assert _accepts(g, tok, '{"a": 1, "b": "x"}')
    assert not _accepts(g, tok, '{"a": 1}') and not _accepts(g, tok, '{"a": 1, "b": 2, "c": 3}')


def _chain(n: int) -> dict:
    defs = {f"M{i}": {"type": "object", "properties": {"v": {"type": "integer"}}} for i in range(n)}
    for i in range(n - 1):
        defs[f"M{i}"]["properties"]["next"] = {"$ref": f"#/$defs/M{i + 1}"}
    return {"$defs": defs, "$ref": "#/$defs/M0"}


@pytest.mark.parametrize(
    "schema,admits",
    [
        ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, False),
        ({"type": "object", "properties": {"a": {"$ref": "#"}}}, True),  # optional: {} ends it
        (
            {
                "$defs": {
                    "A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}
                    | {"required": ["a"]}
                },
                "$ref": "#/$defs/A",
            },
            False,
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                "required": ["a"],
            },
            True,
        ),
        ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, False),
        ({"type": "array", "items": {"$ref": "#"}}, True),  # [] ends it
        ({"type": ["object", "null"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, True),
        # a closed object of one key that must be there (minProperties): that key's cycle
        (
            {"properties": {"a": {"$ref": "#"}}, "minProperties": 1}
            | {"type": "object", "additionalProperties": False},
            False,
        ),
        (
            {"properties": {"a": {"$ref": "#"}, "b": {}}, "minProperties": 1}
            | {"type": "object", "additionalProperties": False},
            True,
        ),
    ],
)
def test_a_schema_no_finite_value_satisfies_is_refused(char_pair, schema, admits):
    """A property it requires refers back to it with no way out: the reply could only run to
    max_tokens (`{"a": {"a": …`); refused before anything runs. Optional, nullable or empty
    ways out pass."""
    if admits:
        char_pair.json_schema(schema)
    else:
        with pytest.raises(ParameterError, match="no finite value"):
            char_pair.json_schema(schema)


def test_a_chain_of_hundreds_of_refs_is_a_parameter_error(char_pair):
    """Thousands of definitions each referring to the next: a RecursionError (a 500) before
    (350 were enough here)."""
    char_pair.json_schema(_chain(20))
    with pytest.raises(ParameterError, match="nests too deep"):
        char_pair.json_schema(_chain(2000))


def test_integer_bounds_past_a_double_are_held_within_it(char_pair):
    """llguidance rounds bounds to doubles (a minimum of 2**53 + 1 let 2**53 through): bounds
    past 2**53 - 1 are held at it, where every value kept meets them, and refused where no
    value within it would."""
    tok = char_pair.tokenizer
    g = char_pair.grammars.json_schema({"type": "integer", "minimum": 0, "maximum": 2**64 - 1})
    assert _accepts(g, tok, str(2**53 - 1)) and not _accepts(g, tok, str(2**53))
    g = char_pair.grammars.json_schema({"type": "integer", "exclusiveMinimum": -(2**60)})
    assert _accepts(g, tok, str(-(2**53) + 1)) and not _accepts(g, tok, str(-(2**53)))
    # a tighter bound on the same side stays (only the one past the limit is held at it)
    g = char_pair.grammars.json_schema({"type": "integer", "maximum": 2**60, "exclusiveMaximum": 5})
    assert _accepts(g, tok, "4") and not _accepts(g, tok, "5") and not _accepts(g, tok, "100")
    for bound in ({"minimum": 2**53}, {"exclusiveMaximum": -(2**53) - 5}):
        with pytest.raises(ParameterError, match="held within"):
            char_pair.json_schema({"type": "integer", **bound})


def test_number_bounds_past_9e17_are_held_within_it(char_pair):
    """llguidance writes no regex for a number range from 1e18 on: a maximum of 1e20, or the
    largest double that schema generators write, was a 400 quoting its internals; bounds it
    writes stay (a minimum of 5e16 compiled before)."""
    tok = char_pair.tokenizer
    for high in (1e20, 1.7976931348623157e308):
        g = char_pair.grammars.json_schema({"type": "number", "minimum": 0, "maximum": high})
        assert _accepts(g, tok, "12.5") and not _accepts(g, tok, "-1")
    g = char_pair.grammars.json_schema({"type": "number", "minimum": -1e20, "exclusiveMaximum": 5})
    assert _accepts(g, tok, "-3") and not _accepts(g, tok, "7")
    with pytest.raises(ParameterError, match="numbers are held within"):
        char_pair.json_schema({"type": "number", "minimum": 1e18})
    g = char_pair.grammars.json_schema({"type": "number", "minimum": 5e16})
    assert _accepts(g, tok, "60000000000000000") and not _accepts(g, tok, "6")
    # inside an allOf (pydantic's allOf: [{$ref}]) and the definitions one extends too
    n = {"type": "number", "minimum": -1e20}
    wrapped = {"allOf": [{"$ref": "#/$defs/N"}], "$defs": {"N": n}}
    g = char_pair.grammars.json_schema(wrapped)
    assert _accepts(g, tok, "-3.5")
    g = char_pair.grammars.json_schema({"allOf": [{"type": "string", "maxLength": 2**40}]})
    assert _accepts(g, tok, '"ab"')
    # a branch's open side is left to its siblings (bounding it refused what they allow),
    # and schemas inside an allOf are found by name (a property named "enum" is one)
    for ok in (
        {"allOf": [{"type": "number"}, {"minimum": 5e16}]},
        {"allOf": [{"type": "integer"}, {"minimum": 10**16}]},
        {"allOf": [{"type": "number"}, {"const": 3e16}]},
        {"allOf": [{"properties": {"enum": {"type": "string", "maxLength": 5 * 10**9}}}]},
    ):
        char_pair.json_schema(ok)


def test_string_lengths_and_patterns_the_engine_cannot_take_say_why(char_pair):
    """A maxLength past 2**32 - 1 bounds nothing (llguidance's regex counts are 32-bit: it
    was a 400 reading "regex parse error:"); a minLength past it is a 400 saying so; a bad
    pattern's error keeps its cause."""
    tok = char_pair.tokenizer
    g = char_pair.grammars.json_schema({"type": "string", "maxLength": 2**53 - 1})
    assert _accepts(g, tok, '"abc"')
    with pytest.raises(ParameterError, match="minLength 4294967296: no reply can be that long"):
        char_pair.json_schema({"type": "string", "minLength": 2**32})
    with pytest.raises(ParameterError, match="regex parse error: unclosed group"):
        char_pair.json_schema({"type": "string", "pattern": "(("})
