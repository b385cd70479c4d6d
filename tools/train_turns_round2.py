"""Round 2 of `train-turns`: prompts that round 1 did not make, from the same material plus the
target's answers to round 1 and to the chitchat first turns.

- third turns: a round-1 follow-up prompt, the target's greedy answer to it, then another
  follow-up of the first prompt's kind (a three-turn conversation);
- chitchat second turns: a chitchat first user turn, the target's greedy answer to it, then the
  human's own second turn of that conversation (real user follow-ups);
- passages, topics, standard-library names and coding tasks that round 1 did not use, and new
  word problems.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from train_turns_templates import FOLLOW_UPS, PASSAGE_TASKS, TOPIC_TASKS

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "dflash2_mlx" / "assets" / "prompts"
REGEN = ROOT / "data" / "smollm2"
STDLIB_NAME = re.compile(r"^[^`]*`([\w.]+)`")


def _greedy_answers(names: tuple[str, ...]) -> dict[str, list[int]]:
    """id -> response ids of the greedy answers that ended before the 256-token cap."""
    out = {}
    for name in names:
        for line in (REGEN / name).read_text().splitlines():
            r = json.loads(line)
            if r["temperature"] == 0.0 and len(r["response_ids"]) < 256:
                out[r["id"]] = r["response_ids"]
    return out


def _first_turn_kinds() -> dict[str, str]:
    kinds = {}
    for split in ("train-broad", "train-deep", "train-wide", "train"):
        for line in (PROMPTS / f"{split}.jsonl").read_text().splitlines():
            p = json.loads(line)
            kinds[p["messages"][0]["content"]] = p["category"]
    return kinds


def third_turns(rng: random.Random, round1: list[dict], n: int, tokenizer) -> list[dict]:
    answers = _greedy_answers(("regen_train-turns.jsonl", "regen_train-turns-rest.jsonl"))
    kinds = _first_turn_kinds()
    pool = [r for r in round1 if r["id"].startswith("t-follow-") and r["id"] in answers]
    out = []
    for r in rng.sample(pool, min(n, len(pool))):
        kind = kinds.get(r["messages"][0]["content"])
        if kind not in FOLLOW_UPS:
            continue
        asked = r["messages"][-1]["content"]
        follow = rng.choice([f for f in FOLLOW_UPS[kind] if f != asked])
        answer = tokenizer.decode(answers[r["id"]], skip_special_tokens=True).strip()
        messages = r["messages"] + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": follow},
        ]
        out.append(
            {"id": f"t2-third-{len(out):04d}", "category": "multi-turn", "messages": messages}
        )
    return out


def _plain_turn(text: str) -> bool:
    words = text.split()
    letters = sum(c.isascii() and c.isalpha() for c in text)
    return 5 <= len(words) <= 80 and letters >= 0.6 * len(text)


def chitchat_second_turns(rng: random.Random, corpus: Path, n: int, tokenizer) -> list[dict]:
    answers = _greedy_answers(("regen_corpus-chat-partial.jsonl", "regen_corpus-chat-rest.jsonl"))
    pool = []
    for line in (corpus / "chitchat.jsonl").read_text().splitlines():
        rec = json.loads(line)
        turns = rec["messages"]
        if rec["id"] in answers and len(turns) >= 3 and _plain_turn(turns[2]["content"]):
            pool.append((rec["id"], turns[0]["content"], turns[2]["content"]))
    out = []
    for cid, first, second in rng.sample(pool, min(n, len(pool))):
        answer = tokenizer.decode(answers[cid], skip_special_tokens=True).strip()
        messages = [
            {"role": "user", "content": first},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": second},
        ]
        out.append(
            {"id": f"t2-chat-{len(out):04d}", "category": "multi-turn", "messages": messages}
        )
    return out


def _topic_patterns() -> list[re.Pattern]:
    forms = [f for fs in TOPIC_TASKS.values() for f in fs]
    return [re.compile(re.escape(f).replace(re.escape("{t}"), "(.+)") + "$") for f in forms]


def _topic_of(text: str, patterns: list[re.Pattern]) -> str | None:
    return next((m.group(1) for p in patterns if (m := p.match(text))), None)


def _passage_of(text: str) -> str:
    for task in PASSAGE_TASKS:
        if text.startswith(task + "\n\n"):
            return text[len(task) + 2 :]
        if text.endswith("\n\n" + task):
            return text[: -len(task) - 2]
    return text


def unused(rows: list[dict], round1: list[dict], prefix: str, n: int) -> list[dict]:
    """The first n round-1-style rows whose passage, topic or text round 1 did not use; ids
    renamed t2-{prefix}-*."""
    patterns = _topic_patterns()
    texts = [r["messages"][-1]["content"] for r in round1]
    seen = set(texts)
    passages = {_passage_of(t) for r, t in zip(round1, texts) if r["category"] == "summaries"}
    topics = {
        _topic_of(t, patterns) for r, t in zip(round1, texts) if r["id"].startswith("t-topic-")
    }
    names = {m.group(1) for t in texts if (m := STDLIB_NAME.search(t))}
    out = []
    for r in rows:
        text = r["messages"][-1]["content"]
        if text in seen or len(out) == n:
            continue
        if r["category"] == "summaries" and _passage_of(text) in passages:
            continue
        if r["id"].startswith("t-topic-") and _topic_of(text, patterns) in topics:
            continue
        if (m := STDLIB_NAME.search(text)) and m.group(1) in names:
            continue
        seen.add(text)
        out.append({**r, "id": f"t2-{prefix}-{len(out):04d}"})
    return out
