"""Fill-in-the-middle: a completion's `suffix` (the text after an editor's cursor) honoured
with the model's FIM tokens, in prefix-suffix-middle order:
<|fim_prefix|>{prompt}<|fim_suffix|>{suffix}<|fim_middle|>; the completion is the middle.
A model without such tokens refuses `suffix` with a 400 naming it: it is never ignored.
"""

from __future__ import annotations

from .api_error import invalid

# (prefix, suffix, middle) token names, by the model families that were trained with them
FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Qwen3(-Coder)
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder(2), SantaCoder, Granite code
)


def fim_ids(tokenizer, vocab: int) -> tuple[int, int, int] | None:
    """The model's (prefix, suffix, middle) token ids; None when it has no such tokens."""
    unk = getattr(tokenizer, "unk_token_id", None)
    for names in FIM_TOKENS:
        try:
            ids = tuple(tokenizer.convert_tokens_to_ids(n) for n in names)
        except Exception:  # a tokenizer without HF's lookup: no FIM
            return None
        if len(set(ids)) == 3 and all(
            isinstance(i, int) and i != unk and 0 <= i < vocab for i in ids
        ):
            return ids
    return None


def fim_text(tokenizer, text: str) -> list[int]:
    """A file's text around the cursor as ids: the server builds the FIM frame, so a marker's
    text in the file (a tokenizer's own source, say) is text, as llama.cpp's /infill takes it."""
    ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return [int(t) for t in ids]


def fim_prompt(tokenizer, fim: tuple[int, int, int] | None, prefix: list[int], suffix: str):
    """The prompt ids of `prefix` (ids) and `suffix` (text, as `fim_text`)."""
    if fim is None:
        raise invalid(
            "suffix",
            "suffix (fill-in-the-middle) is not supported by this model: its tokenizer has no "
            "FIM tokens (<|fim_prefix|> <|fim_suffix|> <|fim_middle|>, or <fim_prefix> ...); "
            "send the text before the cursor alone as the prompt",
            "unsupported_parameter",
        )
    pre, suf, mid = fim
    return [pre, *prefix, suf, *fim_text(tokenizer, suffix), mid]


def completion_ids(tokenizer, fim: tuple[int, int, int] | None, vocab: int, req) -> list[int]:
    """A completion request's prompt ids: its text or token ids, in the FIM frame with a
    `suffix`. An empty suffix (the cursor at the file's end) is FIM on a model that has it,
    else a plain completion: nothing comes after the text either way."""
    framed = req.suffix is not None and (req.suffix != "" or fim is not None)
    if isinstance(req.prompt, str) and framed:  # the file's text: a marker in it is text
        ids = fim_text(tokenizer, req.prompt)
    elif isinstance(req.prompt, str):
        ids = [int(t) for t in tokenizer.encode(req.prompt)]
    else:
        bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise invalid("prompt", f"token id {bad} is outside the vocabulary [0, {vocab})")
        ids = list(req.prompt)
    return fim_prompt(tokenizer, fim, ids, req.suffix) if framed else ids
