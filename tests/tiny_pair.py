"""A tiny target + drafter pair saved to disk as real folders, for CLI tests.

The target is a random llama saved as an mlx-lm folder (config.json + model.safetensors) with a
real word-level tokenizer that has a chat template (Qwen-style `<|im_start|>` turns and an
`enable_thinking` switch) and `<|im_end|>` as EOS. The drafter is `tiny.make_drafter` saved in
the official format. The EOS embedding row is zeroed so that (tied head) its logit is exactly 0
and a random target essentially never ends a turn: answers run to --max-tokens, which keeps the
terminal tests deterministic.

`python tests/tiny_pair.py DIR [--fit]` writes a pair for manual runs (--fit distils the drafter
for a few seconds so drafts get accepted and the live histogram is interesting).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dflash2_mlx  # noqa: F401  (binds the optimized BLAS before MLX loads)
import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny import HIDDEN, VOCAB, make_drafter, make_target  # noqa: E402

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
ROLES = ["system", "user", "assistant"]
PUNCT = [".", ",", "?", "!", ":"]
WORDS = (
    "hello world the a an is are was be to of and in on for with it this that you we they "
    "model token draft verify block fast slow cat dog sun moon river tree stone cloud rain "
    "fire water light dark red blue green one two three four five six seven eight nine ten "
    "apple bread milk tea yes no maybe why how what when where who can will"
).split()
MASK = "<mask>"  # the drafter's mask token: the last id (tiny.VOCAB - 1)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant "
    "{% if enable_thinking is defined and not enable_thinking %}<think> </think> {% endif %}"
    "{% endif %}"
)

TARGET_CONFIG = {
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "num_hidden_layers": 4,
    "intermediate_size": 2 * HIDDEN,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
}


def vocabulary() -> list[str]:
    words = SPECIALS + ROLES + PUNCT + WORDS
    filler = [f"w{i}" for i in range(VOCAB - 1 - len(words))]
    vocab = words + filler + [MASK]
    assert len(vocab) == VOCAB and len(set(vocab)) == VOCAB, len(vocab)
    return vocab


def save_tokenizer(folder: Path, chat_template: str | None = CHAT_TEMPLATE) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS[:3] + [MASK])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(folder))


def save_target(folder: Path, seed: int = 0, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model = make_target("llama", seed=seed)
    weights = dict(tree_flatten(model.parameters()))
    eos = vocabulary().index("<|im_end|>")
    emb = weights["model.embed_tokens.weight"]
    weights["model.embed_tokens.weight"] = mx.concatenate(
        [emb[:eos], mx.zeros((1, emb.shape[1]), emb.dtype), emb[eos + 1 :]]
    )
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    cfg = dict(TARGET_CONFIG, eos_token_id=eos, bos_token_id=vocabulary().index("<|im_start|>"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_tokenizer(folder, chat_template)
    return folder


def save_drafter_folder(
    folder: Path, target_dir: Path | None = None, fit: bool = False, block_size: int = 8
) -> Path:
    from dflash2_mlx import save_drafter

    drafter = make_drafter(2, block_size=block_size, layer_ids=(0, 2))
    if fit:
        from mlx_lm import load

        from tiny import fit_drafter

        target, _ = load(str(target_dir))
        prompts = [[1, 6, 20 + i, 30 + i, 2, 1, 7] for i in range(6)]
        fit_drafter(target, drafter, prompts, steps=300, gen_tokens=40)
    return save_drafter(drafter, folder)


def save_pair(root: Path, fit: bool = False) -> tuple[Path, Path]:
    target = save_target(Path(root) / "target")
    drafter = save_drafter_folder(Path(root) / "drafter", target, fit=fit)
    return target, drafter


def answer(target_dir: Path, drafter_dir: Path, messages: list[dict], max_tokens: int, **kw) -> str:
    """The library's greedy answer (what the chat must print), by the same text layer."""
    import dflash2_mlx as d2
    from dflash2_mlx.text import chat_prompt_ids, generate_text

    pair = d2.load_pair(target_dir, drafter_dir)
    ids = chat_prompt_ids(pair.tokenizer, messages, **kw)
    return generate_text(pair, ids, d2.GenerationParams(max_tokens=max_tokens)).text


if __name__ == "__main__":
    t, d = save_pair(Path(sys.argv[1]), fit="--fit" in sys.argv)
    print(f"--target {t} --drafter {d}")
