"""Regeneration prompts from a `dflash2 corpus` folder: real user turns instead of hand-written ones.

Two pools, both read from the corpus JSONL files (never fetched again):

- `chitchat.jsonl`: the first user turn of each human conversation, kept when it is English-looking
  (mostly ASCII letters) and 5–80 words long (which drops the bare greetings);
- `wiki.jsonl`: the "Tell me about {title}" user turn of a seeded sample of the summaries.

A prompt is dropped when its normalised text (lower-case letters and digits, single spaces) was
already taken, or when it is a near duplicate of a held-out prompt (word-trigram Jaccard ≥ 0.5, or
all its words among a held-out prompt's): the drafter must never see the evaluation prompts. The
output is seeded and deterministic: the same corpus folder and arguments give the same file.

    python -m dflash2_mlx.train.corpus_prompts /work/runs/corpus out.jsonl --wiki 1000
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import DFlash2Error
from ..prompts import load_prompts
from .arg_types import int_at_least


class CorpusPromptsError(DFlash2Error, ValueError):
    """The corpus folder lacks a source file, or one of its lines is not a chat record."""


@dataclass(frozen=True)
class PromptRecipe:
    chat: int | None = None  # chitchat first turns to keep (None: all that pass the filters)
    wiki: int = 1000  # "Tell me about" prompts
    min_words: int = 5
    max_words: int = 80
    seed: int = 0
    exclude: str = "heldout"  # prompt split or file whose near duplicates are dropped

    def __post_init__(self):
        if (self.chat is not None and self.chat < 0) or self.wiki < 0:
            raise CorpusPromptsError(
                f"prompt counts must be >= 0, got chat={self.chat} wiki={self.wiki}"
            )
        if self.chat == 0 and self.wiki == 0:
            raise CorpusPromptsError("chat=0 and wiki=0 leave no prompts to write")
        if not 1 <= self.min_words <= self.max_words:
            raise CorpusPromptsError(
                f"need 1 <= min_words <= max_words, got {self.min_words} and {self.max_words}"
            )


_WORD = re.compile(r"[a-z0-9']+")


def normalise(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def _trigrams(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + 3]) for i in range(max(len(words) - 2, 1))}


def _english(text: str) -> bool:
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) / len(letters) > 0.95


class _Excluder:
    """Near-duplicate test against a fixed prompt set (the held-out prompts)."""

    def __init__(self, texts: list[str]):
        self.sets = [(set(w), _trigrams(w)) for w in (normalise(t).split() for t in texts)]

    def near(self, text: str) -> bool:
        words = normalise(text).split()
        grams, vocab = _trigrams(words), set(words)
        for held_vocab, held_grams in self.sets:
            if vocab <= held_vocab:
                return True
            if len(grams & held_grams) / max(len(grams | held_grams), 1) >= 0.5:
                return True
        return False


def _records(path: Path) -> Iterator[dict]:
    if not path.exists():
        raise CorpusPromptsError(f"{path}: missing (run `dflash2 corpus` into that folder first)")
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            try:
                rec = json.loads(line)
                first = rec["messages"][0]
                if first["role"] != "user" or not isinstance(first["content"], str):
                    raise ValueError("the first message is not a user turn")
                yield {"id": str(rec["id"]), "content": first["content"].strip()}
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise CorpusPromptsError(f"{path}:{lineno}: not a chat record ({exc})") from None


def build_prompts(corpus: str | Path, recipe: PromptRecipe = PromptRecipe()) -> list[dict]:
    """Prompt records ({"id", "category", "messages"}) in a seeded order mixing both pools."""
    corpus = Path(corpus)
    excluder = _Excluder([p.messages[-1]["content"] for p in load_prompts(recipe.exclude)])
    seen: set[str] = set()
    rng = random.Random(recipe.seed)

    def keep(text: str) -> bool:
        key = normalise(text)
        if not key or key in seen or excluder.near(text):
            return False
        seen.add(key)
        return True

    chat = [
        r
        for r in _records(corpus / "chitchat.jsonl")
        if recipe.min_words <= len(normalise(r["content"]).split()) <= recipe.max_words
        and _english(r["content"])
        and keep(r["content"])
    ]
    rng.shuffle(chat)
    chat = chat[: recipe.chat] if recipe.chat is not None else chat
    wiki = list(_records(corpus / "wiki.jsonl")) if recipe.wiki else []  # 0: need no file
    rng.shuffle(wiki)
    wiki = [r for r in wiki if _english(r["content"]) and keep(r["content"])][: recipe.wiki]
    out = [_prompt(r, "corpus-chat") for r in chat] + [_prompt(r, "corpus-wiki") for r in wiki]
    rng.shuffle(out)
    return out


def _prompt(rec: dict, category: str) -> dict:
    return {
        "id": rec["id"],
        "category": category,
        "messages": [{"role": "user", "content": rec["content"]}],
    }


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dflash2_mlx.train.corpus_prompts", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("corpus", help="a `dflash2 corpus` output folder")
    ap.add_argument("out", help="prompt JSONL to write (overwritten)")
    ap.add_argument(
        "--chat",
        type=int_at_least(0),
        default=None,
        help="chitchat first turns to keep, 0 for none (default: all)",
    )
    ap.add_argument(
        "--wiki",
        type=int_at_least(0),
        default=PromptRecipe.wiki,
        help='"Tell me about {title}" prompts to keep (default: %(default)s)',
    )
    ap.add_argument("--seed", type=int, default=0, help="shuffle seed (default: %(default)s)")
    ap.add_argument(
        "--exclude",
        default="heldout",
        help="prompt split or file whose near duplicates are dropped (default: %(default)s)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.chat == 0 and args.wiki == 0:
        ap.error("--chat 0 and --wiki 0 leave no prompts to write")
    recipe = PromptRecipe(chat=args.chat, wiki=args.wiki, seed=args.seed, exclude=args.exclude)
    try:
        prompts = build_prompts(args.corpus, recipe)
    except (DFlash2Error, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    with open(args.out, "w", encoding="utf-8") as fh:
        for p in prompts:
            fh.write(json.dumps(p, ensure_ascii=False) + "\n")
    counts = {c: sum(p["category"] == c for p in prompts) for c in ("corpus-chat", "corpus-wiki")}
    print(f"{len(prompts)} prompts {counts} -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
