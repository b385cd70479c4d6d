"""A GGUF's byte-level BPE tokenizer (llama.cpp `gpt2` model) rebuilt as a Hugging Face fast
tokenizer from its metadata alone (no `gguf` package), saved so transformers 4.x and 5.x load it."""

from __future__ import annotations

import json
from pathlib import Path

CONTROL = 3  # llama.cpp token type of control (special) tokens


def bpe_tokenizer(meta: dict):
    """The `tokenizers.Tokenizer`: vocabulary, merges, pre-tokenizer, control tokens added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = list(meta["tokenizer.ggml.tokens"])
    types = meta["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=merges,
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    split_digits = meta.get("tokenizer.ggml.pre") in ("smollm", "starcoder", "refact")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, kind in zip(tokens, types) if kind == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok, control


def fast_tokenizer(meta: dict):
    """The `PreTrainedTokenizerFast`: special tokens, chat template and limits from `meta`."""
    from transformers import PreTrainedTokenizerFast

    tok, control = bpe_tokenizer(meta)
    tokens = meta["tokenizer.ggml.tokens"]

    def special(key):
        idx = meta.get(f"tokenizer.ggml.{key}")
        return tokens[idx.item()] if idx is not None else None

    named = {special("bos_token_id"), special("eos_token_id"), special("unknown_token_id")}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special("bos_token_id"),
        eos_token=special("eos_token_id"),
        unk_token=special("unknown_token_id"),
        pad_token=special("padding_token_id"),
        additional_special_tokens=[t for t in control if t not in named],
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=meta["llama.context_length"].item(),
        clean_up_tokenization_spaces=False,
        add_bos_token=bool(meta["tokenizer.ggml.add_bos_token"].item())
        if "tokenizer.ggml.add_bos_token" in meta
        else False,
    )


def save_portable(fast, out: Path) -> None:
    """save_pretrained, then a tokenizer_config.json both transformers 4.x and 5.x read: the
    generic fast class, a list of additional special tokens, and the chat template inline as
    well as in chat_template.jinja."""
    fast.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    extra = cfg.pop("extra_special_tokens", None)
    cfg.pop("backend", None)
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = extra
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=fast.chat_template)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
