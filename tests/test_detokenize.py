"""Streamed text equals the tokenizer's decode of the same ids, however the ids arrive (a
token at a time with stop strings, rounds of any length), when characters split across byte
tokens — also after real U+FFFD characters and invalid bytes, which once made the decoder
show an incomplete character's U+FFFD for good (`'������ ok'` for `'����搐 ok'`)."""

import os
import random

import pytest
from mlx_lm.utils import load_tokenizer
from smollm2 import any_conversion

from dflash2_mlx.engine.events import RoundEvent
from dflash2_mlx.engine.logprobs import TokenLogprob
from dflash2_mlx.serve.logprobs import Logprobs
from dflash2_mlx.text import IncrementalDecoder
from dflash2_mlx.token_bytes import incomplete_tail, knows_token_bytes

# the embedded SmolLM2's tokenizer: on the worker that converts it (conftest)
pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(any_conversion(tmp_path_factory))


def _byte_ids(tok) -> dict[int, int]:
    """The single-byte token of each byte value (byte-level BPE has all 256)."""
    from mlx_lm.tokenizer_utils import _byte_decoder

    char_of = {b: c for c, b in _byte_decoder().items()}
    return {b: tok.convert_tokens_to_ids(char_of[b]) for b in range(256)}


def _streamed(tok, ids, sizes, context=None) -> str:
    decoder, text, i = IncrementalDecoder(tok, context or tok.encode("Say:")), "", 0
    while i < len(ids):
        step = next(sizes)
        text += decoder.add(ids[i : i + step], final=i + step >= len(ids))
        i += step
    return text


def _want(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_real_replacement_characters_then_a_split_character(tok):
    assert knows_token_bytes(tok)
    byte = _byte_ids(tok)
    fffd = tok.encode("\ufffd")
    for n in range(1, 6):
        ids = fffd * n + [byte[0xE6], byte[0x90], byte[0x90]] + tok.encode(" ok")
        assert _want(tok, ids) == "\ufffd" * n + "搐 ok"
        for step in (1, 2, 3, len(ids)):
            assert _streamed(tok, ids, iter(lambda s=step: s, None)) == "\ufffd" * n + "搐 ok"


def test_random_bytes_in_random_rounds(tok):
    """Partial and invalid UTF-8 (bytes 0x80-0xff) among whole characters, in rounds of 1-5."""
    byte, rng = _byte_ids(tok), random.Random(7)
    pool = [byte[b] for b in range(0x80, 0x100)] + tok.encode("晨你好👨‍👩‍👧 a b.")
    for _ in range(600):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        sizes = iter(lambda: rng.randint(1, 5), None)
        assert _streamed(tok, ids, sizes) == _want(tok, ids), ids


def test_a_character_the_prompt_opened_is_completed_by_the_reply(tok):
    """A prompt of ids may end inside a character (a cut reply sent back to continue): the
    reply's text is what decoding it after the prompt adds to the prompt's whole characters,
    the same whichever byte the prompt stopped at; a character never completed stays the
    prompt's."""
    byte, rng = _byte_ids(tok), random.Random(3)
    say = tok.encode("Say:")
    for char in ("晨", "😀", "é"):
        data = [byte[b] for b in char.encode()]
        for cut in range(1, len(data)):
            reply = data[cut:] + tok.encode(" ok")
            for step in (1, 2, len(reply)):
                got = _streamed(tok, reply, iter(lambda s=step: s, None), say + data[:cut])
                assert got == char + " ok", (char, cut, step, got)
        assert _streamed(tok, tok.encode("A"), iter(lambda: 1, None), say + data[:1]) == "A"
    pool = [byte[b] for b in range(0x80, 0x100)] + tok.encode("晨你好 a.")
    for _ in range(300):
        context = say + [rng.choice(pool) for _ in range(rng.randint(0, 3))]
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 8))]
        full, shown = _want(tok, context + ids), _want(tok, context)
        want = full[len(os.path.commonprefix([full, shown])) :]
        sizes = iter(lambda: rng.randint(1, 4), None)
        assert _streamed(tok, ids, sizes, context) == want, (context, ids)


def test_every_token_gets_its_logprob_entry(tok):
    """Entries go out with their token's text: after real U+FFFD ones, a split character's
    tokens once started past the text's end and were never sent."""
    byte = _byte_ids(tok)
    ids = tok.encode("\ufffd") * 4 + [byte[0xE6], byte[0x90], byte[0x90]] + tok.encode(" ok")
    lp = Logprobs(tok, "chat", frozenset())
    for t in ids:
        lp.add(RoundEvent(tokens=[t], logprobs=(TokenLogprob(t, -1.0, ()),)))
    text = lp.decoder.text
    assert text == "\ufffd" * 4 + "搐 ok"
    entries = lp.take(len(text))["content"]
    assert len(entries) == len(ids)
    assert b"".join(bytes(e["bytes"]) for e in entries).decode() == text


@pytest.mark.parametrize(
    "data,tail",
    [(b"ok", 0), (b"\xe6", 1), (b"\xe6\x90", 2), (b"\xe6\x90\x90", 0), (b"\xf0\x9f\x99", 3)]
    + [(b"\x90", 0), (b"\x90\x90\x90\x90", 0), (b"a\xc3", 1), (b"\xef\xbf\xbd", 0)],
)
def test_incomplete_tail(data, tail):
    assert incomplete_tail(data) == tail


@pytest.fixture(scope="module")
def spm_tok(tmp_path_factory):
    """A Llama-2 / Mistral-style tokenizer: SentencePiece pieces (▁ for a space) and a byte
    token <0x00>..<0xFF> for every byte no piece spells (byte fallback)."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["▁", "▁the", "▁hello", "中", "文", "é", "a", "b", "x", ",", "."]
    vocab = ["<unk>", "<s>", "</s>", *[f"<0x{i:02X}>" for i in range(256)], *pieces]
    model = models.BPE({w: i for i, w in enumerate(vocab)}, [], unk_token="<unk>")
    model.byte_fallback = True
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    folder = tmp_path_factory.mktemp("spm")
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>"
    ).save_pretrained(folder)
    return load_tokenizer(folder)


def test_byte_fallback_text_does_not_depend_on_the_rounds(spm_tok):
    """A byte-fallback decode turns a whole run of byte tokens into U+FFFD when one of them
    is invalid or unfinished (a reply cut inside a character): the window rewrote text
    already shown, which was sent again ('中' then a cut '文' came out '中����'), and the text
    changed with how the ids fell into rounds. Now it is mlx-lm's detokenizer's text, in any
    rounds, and the tokenizer's decode where the bytes are valid."""
    tok, rng = spm_tok, random.Random(5)
    assert knows_token_bytes(tok)
    byte = {b: tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)}
    han = [byte[b] for b in "文".encode()]  # a character no piece spells here: its bytes
    cut = tok.encode("中", add_special_tokens=False) + han[:1]
    assert _streamed(tok, cut, iter(lambda: 1, None)) == " 中\ufffd"  # after "Say:"
    pool = [*byte.values(), *tok.encode("the hello 中文 é a, b.", add_special_tokens=False)]
    for _ in range(300):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 10))]
        detok = tok._detokenizer
        detok.reset()
        for t in ids:
            detok.add_token(t)
        detok.finalize()
        for step in (1, 3, len(ids)):
            got = _streamed(tok, ids, iter(lambda s=step: s, None))
            assert got == _streamed(tok, ids, iter(lambda: rng.randint(1, 4), None)), ids
            assert got.lstrip(" ") == detok.text.lstrip(" "), (ids, got, detok.text)
        alone = set()  # no prompt before it (the library's): its first space dropped alike
        for sizes in ([1] * len(ids), [len(ids)], [2] * len(ids)):
            decoder, text, i = IncrementalDecoder(tok, []), "", 0
            for step in sizes:
                text += decoder.add(ids[i : i + step], final=i + step >= len(ids))
                i += step
            alone.add(text)
        assert alone == {detok.text}, (ids, alone, detok.text)
        if "\ufffd" not in _want(tok, ids):
            assert (
                got
                == _want(tok, [*tok.encode("Say:"), *ids])[len(_want(tok, tok.encode("Say:"))) :]
            )


def test_a_token_after_held_invalid_bytes_starts_past_their_replacement(spm_tok):
    """A lead byte no character completes is held, then shown as U+FFFD with the token after
    it: that token's completion text_offset pointed at the U+FFFD, not at its own text."""
    tok = spm_tok
    byte = {b: tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)}
    comma = tok.convert_tokens_to_ids(",")
    ids = [*tok.encode("a", add_special_tokens=False), byte[0xCE], comma, byte[0xE4]]
    ids += [byte[0xB8], byte[0xAD], comma]  # 中 from its bytes, then a comma
    lp = Logprobs(tok, "completion", frozenset())
    for t in ids:
        lp.add(RoundEvent(tokens=[t], logprobs=(TokenLogprob(t, -1.0, ()),)))
    text = lp.decoder.text
    assert text == "a\ufffd,中,"
    starts = lp.take(len(text))["text_offset"]
    assert [text[s] for s, t in zip(starts, ids) if t == comma] == [",", ","]
    assert text[starts[ids.index(byte[0xCE])]] == "\ufffd"  # the held byte's own
    assert starts == sorted(starts)
    # several held in a row: an unfinished character's bytes go on with it, a new lead does
    # not (the last token started at the text's end: its entry was never sent)
    han = [tok.convert_tokens_to_ids("中")]
    for held, want in (
        ([0xCD, 0xF0, 0x9F, 0x99], "\ufffd\ufffd中"),
        ([0xE4, 0xE4], "\ufffd\ufffd中"),
    ):
        lp = Logprobs(tok, "completion", frozenset(), prompt=tok.encode("Say:"))
        ids = [byte[b] for b in held] + han
        for t in ids:
            lp.add(RoundEvent(tokens=[t], logprobs=(TokenLogprob(t, -1.0, ()),)))
        text = lp.decoder.text
        assert text.endswith(want), (held, text)
        got = lp.take(len(text), whole=True, end=True)
        assert len(got["tokens"]) == len(ids) and text[got["text_offset"][-1] :].startswith("中")
