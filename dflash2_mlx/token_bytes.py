"""The bytes each token adds to a text, and where a UTF-8 character is still incomplete: a
streamed text holds back the tokens of a character until its last byte arrives."""

from __future__ import annotations


def _detokenizer_kinds() -> tuple[type, ...]:
    from mlx_lm import tokenizer_utils as tu

    return tu.SPMStreamingDetokenizer, tu.BPEStreamingDetokenizer


def knows_token_bytes(tokenizer) -> bool:
    """Whether `token_bytes` reads the vocabulary's bytes (byte-level BPE, SentencePiece),
    rather than decoding a token alone (which turns a partial character into U+FFFD)."""
    return isinstance(getattr(tokenizer, "_detokenizer", None), _detokenizer_kinds())


def trims_first_space(tokenizer) -> bool:
    """A SentencePiece vocabulary whose decode drops the text's first space (the '▁' its
    first word carries), as mlx-lm's detokenizer does too."""
    from mlx_lm import tokenizer_utils as tu

    det = getattr(tokenizer, "_detokenizer", None)
    return isinstance(det, tu.SPMStreamingDetokenizer) and bool(getattr(det, "trim_space", 0))


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes `token` adds to a text: from the tokenizer's byte-level or SentencePiece
    vocabulary where mlx-lm's detokenizer knows it, else its decoded text's UTF-8."""
    from mlx_lm import tokenizer_utils as tu

    det = getattr(tokenizer, "_detokenizer", None)
    if isinstance(det, tu.SPMStreamingDetokenizer) and token < len(det.tokenmap):
        return det.tokenmap[token].replace("\u2581".encode(), b" ")
    if isinstance(det, tu.BPEStreamingDetokenizer) and token < len(det.tokenmap):
        table, piece = tu._byte_decoder(), det.tokenmap[token]
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
    return tokenizer.decode([token]).encode("utf-8")


def incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character whose other bytes have not
    come yet (0: it ends on a character's end, or in invalid bytes, which stay U+FFFD)."""
    for k in range(1, min(4, len(data)) + 1):
        byte = data[-k]
        if byte & 0xC0 == 0x80:  # a continuation byte: its lead byte is further back
            continue
        if byte >> 5 == 0b110:
            need = 2
        elif byte >> 4 == 0b1110:
            need = 3
        elif byte >> 3 == 0b11110:
            need = 4
        else:  # ASCII, or a byte no character starts with
            return 0
        return k if k < need else 0
    return 0
