"""Round 6 of `train-turns`: real conversations continued at a later turn.

Each chitchat conversation (human to human) is cut after one of its later user turns (the 3rd,
5th, 7th or 9th message): the earlier turns stay as the humans wrote them, both sides, and the
target answers the last user turn. Held-out multi-turn prompts also carry hand-written
assistant turns, which rounds 1-5 (whose earlier assistant turns are the target's own answers)
did not cover. At most two cuts a conversation; the last user turn must be plain English of
5-80 words, the whole prefix at most 300 words, and no last turn near a held-out prompt
(word-trigram Jaccard >= 0.5, or all its words among a held-out prompt's). Needs chitchat.jsonl
in the corpus folder (`dflash2 corpus --sources chitchat`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from train_turns_round2 import _plain_turn

from dflash2_mlx.train.corpus_prompts import _english, _Excluder

CUTS = (3, 5, 7, 9)  # messages kept: the last one is a user turn
MAX_PREFIX_WORDS = 300
PER_CONVERSATION = 2


def _cuts(messages: list[dict]) -> list[int]:
    out = []
    for k in CUTS:
        if len(messages) < k or messages[k - 1]["role"] != "user":
            continue
        text = messages[k - 1]["content"]
        words = sum(len(m["content"].split()) for m in messages[:k])
        if _plain_turn(text) and _english(text) and words <= MAX_PREFIX_WORDS:
            out.append(k)
    return out


def round6(rng: random.Random, corpus: Path, held: set[str]) -> list[dict]:
    excluder = _Excluder(sorted(held))
    rows, seen = [], set(held)
    for line in (corpus / "chitchat.jsonl").read_text().splitlines():
        messages = [
            {"role": m["role"], "content": m["content"].strip()}
            for m in json.loads(line)["messages"]
        ]
        cuts = _cuts(messages)
        for k in sorted(rng.sample(cuts, min(PER_CONVERSATION, len(cuts)))):
            last = messages[k - 1]["content"]
            if last in seen or excluder.near(last):
                continue
            seen.add(last)
            rows.append({"category": "multi-turn", "messages": messages[:k]})
    rng.shuffle(rows)
    return [{"id": f"t6-chat-{i:04d}", **r} for i, r in enumerate(rows)]
