"""Draft vocabulary (FR-Spec style): drafts come from a subset of the LM head's rows; the output
stays exactly the target's (greedy) or follows its distribution (sampling)."""

import json
from collections import Counter

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import tiny
from test_sampling import V as SAMPLING_V
from test_sampling import empirical, exact_marginals, tv

from dflash2_mlx import GenerationParams, GenerationStats, SamplingParams, SpeculativeDecoder
from dflash2_mlx import load_drafter, save_drafter
from dflash2_mlx.drafter.vocab import (
    DRAFT_VOCAB_FILE,
    count_tokens,
    read_draft_vocab,
    write_draft_vocab,
)
from dflash2_mlx.errors import CheckpointError, ParameterError
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.target.head import restricted_head

FIT_PROMPTS = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9], [2, 7, 1, 8, 2, 8, 1, 8], [60, 61, 62]]


def _head(tied: bool, quantized: bool):
    model = tiny.make_target("llama", tie_word_embeddings=tied)
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    return TargetAdapter(model, (0, 2)).head


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("quantized", [False, True])
def test_restricted_head_is_the_full_heads_columns(tied, quantized):
    head = _head(tied, quantized)
    ids = mx.array([5, 0, 77, 31, 94, 12], dtype=mx.int32)
    x = mx.random.normal((3, tiny.HIDDEN), key=mx.random.key(4))
    want = mx.take(head(x), ids, axis=-1)
    restricted = restricted_head(head, ids)
    assert type(restricted).__name__ == ("QuantizedRowsHead" if quantized else "RowsHead")
    got = restricted(x)
    assert got.shape == (3, 6)
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item()
    # An unknown kind of head still gives the same logits (computed whole, then taken).
    fallback = restricted_head(lambda v: head(v) * 1.0, ids)(x)
    assert mx.allclose(fallback, want, atol=1e-6).item()


def test_restricted_head_of_a_linear_with_bias():
    head = nn.Linear(tiny.HIDDEN, tiny.VOCAB, bias=True)
    head.bias = mx.random.normal((tiny.VOCAB,), key=mx.random.key(1))
    ids = mx.array([3, 90, 41], dtype=mx.int32)
    x = mx.random.normal((2, tiny.HIDDEN), key=mx.random.key(2))
    restricted = restricted_head(head, ids)
    assert type(restricted).__name__ == "RowsHead"
    assert mx.allclose(restricted(x), mx.take(head(x), ids, axis=-1), atol=1e-5).item()


def _decoder(model, drafter, vocab):
    drafter.set_draft_vocab(vocab)
    return SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafts_only_use_the_draft_vocabulary(version, temperature):
    model = tiny.make_target("llama")
    vocab = list(range(0, tiny.VOCAB, 3))
    dec = _decoder(model, tiny.make_drafter(version), vocab)
    assert dec.drafter.draft_vocab.tolist() == vocab
    session = dec.new_session()
    sp = SamplingParams(temperature=temperature, seed=0)
    key = mx.random.key(0)
    prefill = dec._begin(session, [3, 14, 15, 9, 26]).run(dec.prefill_chunk)
    token = prefill.finish(SamplingParams(), key)  # greedy first token
    proposal = dec._draft(session, token, 8, sp, key)
    drafts, q, cand = proposal.drafts, proposal.q, proposal.candidates
    assert len(drafts) == 7 and set(drafts) <= set(vocab)
    if temperature > 0:  # q is a distribution over candidate ids from the vocabulary
        assert set(np.array(cand).ravel().tolist()) <= set(vocab)
        assert np.allclose(np.array(q).sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("version", [1, 2])
def test_greedy_is_lossless_with_a_draft_vocabulary(version):
    """Distilled drafter, vocabulary = the tokens the target emits on these prompts minus a few:
    drafts get accepted, and the output is still exactly plain greedy decoding."""
    model = tiny.make_target("llama")
    refs = [tiny.greedy_reference(model, p, 40) for p in FIT_PROMPTS]
    emitted = sorted({t for r in refs for t in r})
    drafter = tiny.fit_drafter(
        model, tiny.make_drafter(version, block_size=8), FIT_PROMPTS, steps=150
    )
    dec = _decoder(model, drafter, emitted[2:])  # two emitted tokens can never be drafted
    stats = GenerationStats()
    for prompt, ref in zip(FIT_PROMPTS, refs):
        out = []
        for ev in dec.stream(prompt, GenerationParams(max_tokens=40, block_size=8)):
            stats.add(ev)
            out.extend(ev.tokens)
        assert out == ref, prompt
    assert stats.accepted > 0


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_sampling_follows_the_target_with_a_draft_vocabulary(version):
    model = tiny.make_target("llama", vocab=SAMPLING_V, seed=11)
    drafter = tiny.make_drafter(
        version, vocab=SAMPLING_V, mask_token_id=SAMPLING_V - 1, seed=12, top_k=4
    )
    dec = _decoder(model, drafter, [0, 2, 3, 5, 7, 8, 9, 11])
    sp = SamplingParams(temperature=1.0)
    emp = empirical(dec, sp, 1200)
    exact = exact_marginals(model, sp)
    for i in range(3):
        assert tv(emp[i], exact[i]) < 0.085, (i, tv(emp[i], exact[i]))


def test_file_round_trip_and_loading(tmp_path):
    drafter = tiny.make_drafter(2)
    save_drafter(drafter, tmp_path)
    assert load_drafter(tmp_path).draft_vocab is None  # no file: the whole vocabulary
    counts = count_tokens([[5, 5, 9], [9, 9, 1]])
    write_draft_vocab(tmp_path, counts, "test")
    data = json.loads((tmp_path / DRAFT_VOCAB_FILE).read_text())
    assert data["token_ids"] == [9, 5, 1] and data["counts"] == [3, 2, 1]
    assert load_drafter(tmp_path).draft_vocab.tolist() == [9, 5, 1]
    assert load_drafter(tmp_path, draft_vocab=False).draft_vocab is None


@pytest.mark.parametrize("version", [1, 2])
def test_a_limit_keeps_the_most_frequent_ids(tmp_path, version):
    """draft_vocab_limit=N drafts from the file's first N ids (most frequent first); a limit
    over the file's size keeps them all; nonsense limits are refused before any weight is read."""
    save_drafter(tiny.make_drafter(version), tmp_path)
    ranked = list(range(90, 20, -1))  # 70 ids, most frequent first
    write_draft_vocab(tmp_path, Counter({t: 100 - i for i, t in enumerate(ranked)}), "test")
    assert load_drafter(tmp_path, draft_vocab_limit=16).draft_vocab.tolist() == ranked[:16]
    assert load_drafter(tmp_path, draft_vocab_limit=500).draft_vocab.tolist() == ranked
    least = 16 if version == 2 else 1  # the tiny DFlash2 selector ranks 16 candidates
    with pytest.raises(ParameterError, match=f"limit is {least - 1}; it must be at least {least}"):
        load_drafter(tmp_path, draft_vocab_limit=least - 1)
    for bad in (20.5, True, "20"):
        with pytest.raises(ParameterError, match="draft_vocab_limit must be an int or None"):
            load_drafter(tmp_path, draft_vocab_limit=bad)
    with pytest.raises(ParameterError, match="contradicts drafting from the whole vocabulary"):
        load_drafter(tmp_path, draft_vocab=False, draft_vocab_limit=20)
    (tmp_path / DRAFT_VOCAB_FILE).unlink()
    with pytest.raises(CheckpointError, match=f"{tmp_path}: has no draft_vocab.json"):
        load_drafter(tmp_path, draft_vocab_limit=20)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("{not json", "not readable JSON"),
        ('{"format": "other", "version": 1, "token_ids": [1]}', '"format": "dflash2-draft-vocab"'),
        ('{"format": "dflash2-draft-vocab", "version": 2, "token_ids": [1]}', "field 'version'"),
        ('{"format": "dflash2-draft-vocab", "version": 1, "token_ids": []}', "field 'token_ids'"),
        ('{"format": "dflash2-draft-vocab", "version": 1, "token_ids": [1, 96]}', "holds 96"),
        ('{"format": "dflash2-draft-vocab", "version": 1, "token_ids": [1, true]}', "holds True"),
        ('{"format": "dflash2-draft-vocab", "version": 1, "token_ids": [1, 1]}', "repeats"),
    ],
)
def test_bad_files_are_named_with_the_field(tmp_path, content, needle):
    (tmp_path / DRAFT_VOCAB_FILE).write_text(content)
    with pytest.raises(CheckpointError, match="draft_vocab.json") as err:
        read_draft_vocab(tmp_path, tiny.VOCAB)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "ids,needle",
    [
        ([], "a non-empty list of token ids"),
        (["a", 2], "a non-empty list of token ids"),
        ([1, tiny.VOCAB + 3], f"id {tiny.VOCAB + 3} is outside the vocabulary"),
        ([1, -1], "id -1 is outside the vocabulary"),
        ([4, 4, 5], "must be distinct"),
    ],
)
def test_a_draft_vocabulary_of_bad_ids_is_refused(ids, needle):
    d = tiny.make_drafter(2, block_size=4)
    with pytest.raises(ParameterError, match=needle):
        d.set_draft_vocab(ids)
    assert d.draft_vocab is None  # unchanged
    d.set_draft_vocab(np.array([5, 1, 4]))  # any int container
    assert d.draft_vocab.tolist() == [5, 1, 4]
