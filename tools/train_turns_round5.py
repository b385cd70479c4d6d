"""Round 5 of `train-turns`: tasks over the target's own greedy answers that rounds 1-4 did not
set, and more numeric problems:

- code reading: a code block the target wrote (5-30 lines) to explain, comment, test, port or
  check for bugs;
- sentence editing: one sentence of an answer to rewrite (formal, shorter, simpler, a question,
  other wordings, grammar);
- story continuations: the first sentences of a story the target told, to continue or finish;
- reading tasks over the target's own answers round 4 did not use;
- numeric word problems of round 4's kinds that round 4 did not make;
- third turns: a round-4 second turn, the target's greedy answer to it, then another follow-up
  (needs `regen_train-turns4.jsonl` in data/smollm2).

Needs no corpus folder. Wording below and in train_turns_round4_templates.py.
"""

from __future__ import annotations

import json
import random
import re

import train_turns_round4 as r4
import train_turns_round4_templates as t4
from train_turns_round3 import _fill
from train_turns_templates import FOLLOW_UPS

ROUND4 = r4.REGEN / "regen_train-turns4.jsonl"
# The answer files round 5 drew on: round 4's and the two made with it.
ROUND5_SOURCES = r4.ROUND4_SOURCES + ["regen_train-rest-t05-more.jsonl", "regen_train-turns4.jsonl"]
CODE_BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

CODE_TASKS = [
    "Explain what this code does:\n\n```{lang}\n{code}```",
    "```{lang}\n{code}```\n\nAdd helpful comments to this code.",
    "Can this code fail? Point out any bugs or edge cases.\n\n```{lang}\n{code}```",
    "```{lang}\n{code}```\n\nWrite a short test for this code.",
    "Rewrite this code in {other}:\n\n```{lang}\n{code}```",
    "```{lang}\n{code}```\n\nHow could this code be made simpler?",
    "Describe this code in two sentences for someone who does not program.\n\n```{lang}\n{code}```",
]
OTHER_LANGS = ["JavaScript", "Python", "Java", "Go", "C#", "Ruby", "TypeScript"]
SENTENCE_TASKS = [
    "Rewrite this sentence in a more formal tone: {s}",
    "Make this sentence shorter without losing its meaning: {s}",
    "Rewrite this sentence for a young child: {s}",
    "Turn this sentence into a question: {s}",
    "Give me three other ways to say this: {s}",
    "Check this sentence for grammar and spelling mistakes: {s}",
    "Paraphrase this sentence: {s}",
    'What does this sentence mean? "{s}"',
]
STORY_TASKS = [
    "Continue this story:\n\n{s}",
    "Here is the start of a story. Write what happens next.\n\n{s}",
    "{s}\n\nFinish this story in under 150 words.",
    "Write the ending of this story:\n\n{s}",
]


def _answers(tokenizer, categories: tuple[str, ...], finished: bool) -> list[tuple[str, str]]:
    """(category, text) of the greedy training answers of these categories, deduplicated."""
    out: dict[str, str] = {}
    for name in ROUND5_SOURCES:
        for line in (r4.REGEN / name).read_text().splitlines():
            r = json.loads(line)
            if r["temperature"] != 0.0 or r["category"] not in categories:
                continue
            if finished and r.get("finish_reason") != "stop":
                continue
            out.setdefault(
                tokenizer.decode(r["response_ids"], skip_special_tokens=True), r["category"]
            )
    return [(c, t.strip()) for t, c in out.items()]


def code_reading(rng: random.Random, tokenizer, n: int) -> list[list[dict]]:
    blocks: dict[str, str] = {}
    for _, text in _answers(tokenizer, ("code",), finished=True):
        for lang, code in CODE_BLOCK.findall(text):
            if 5 <= len(code.splitlines()) <= 30 and len(code) <= 1200:
                blocks.setdefault(code, lang or "python")
    out = []
    for code, lang in rng.sample(sorted(blocks.items()), min(n, len(blocks))):
        other = rng.choice([x for x in OTHER_LANGS if x.lower() != lang.lower()])
        out.append(r4._user(rng.choice(CODE_TASKS).format(lang=lang, code=code, other=other)))
    return out


def _sentences(text: str) -> list[str]:
    out = []
    for s in SENTENCE_END.split(text.replace("\n", " ")):
        words = s.split()
        if 8 <= len(words) <= 30 and s[0].isupper() and s[-1] in ".!" and "*" not in s:
            out.append(" ".join(words))
    return out


def sentence_editing(rng: random.Random, tokenizer, n: int) -> list[list[dict]]:
    pool: dict[str, None] = {}
    for _, text in _answers(tokenizer, ("chat", "instructions", "stories"), finished=False):
        for s in _sentences(text):
            pool[s] = None
    return [
        r4._user(rng.choice(SENTENCE_TASKS).format(s=s))
        for s in rng.sample(sorted(pool), min(n, len(pool)))
    ]


def story_continuations(rng: random.Random, tokenizer, n: int) -> list[list[dict]]:
    starts: dict[str, None] = {}
    for _, text in _answers(tokenizer, ("stories",), finished=False):
        first = SENTENCE_END.split(text.replace("\n\n", " ").strip())[: rng.choice([2, 3])]
        start = " ".join(first)
        if 15 <= len(start.split()) <= 80 and start[-1] in '.!?"':
            starts[start] = None
    return [
        r4._user(rng.choice(STORY_TASKS).format(s=s))
        for s in rng.sample(sorted(starts), min(n, len(starts)))
    ]


def unused_reading(rng: random.Random, tokenizer, round4_rows: list[dict]) -> list[list[dict]]:
    """Round 4's reading tasks over the own answers round 4 did not use."""
    used = "\n".join(
        r["messages"][-1]["content"] for r in round4_rows if r["id"].startswith("t4-read")
    )
    texts = [t for t in r4.own_texts(tokenizer, ROUND5_SOURCES) if t not in used]
    return r4.reading_tasks(rng, texts, len(texts))


def third_turns(rng: random.Random, tokenizer, round4_rows: list[dict], n: int) -> list[list[dict]]:
    answers = {}
    for line in ROUND4.read_text().splitlines():
        r = json.loads(line)
        if r["id"].startswith("t4-second-") and r4._finished(r):
            answers[r["id"]] = tokenizer.decode(r["response_ids"], skip_special_tokens=True).strip()
    kinds = {}
    for line in r4.ROUND3.read_text().splitlines():
        r = json.loads(line)
        turns = r4.USER_TURN.findall(tokenizer.decode(r["prompt_ids"]))
        if turns:
            kinds[turns[0]] = r["category"]
    pool = [r for r in round4_rows if r["id"] in answers and kinds.get(r["messages"][0]["content"])]
    out = []
    for r in rng.sample(pool, min(n, len(pool))):
        kind = kinds[r["messages"][0]["content"]]
        follow = rng.choice([f for f in FOLLOW_UPS[kind] if f != r["messages"][-1]["content"]])
        out.append(
            r["messages"]
            + [
                {"role": "assistant", "content": answers[r["id"]]},
                {"role": "user", "content": follow},
            ]
        )
    return out


def round5(
    rng: random.Random, tokenizer, held_texts: set[str], round4_rows: list[dict]
) -> list[dict]:
    """Round 5's prompts minus any single-turn text a training split or round 4 already has
    or close to a held-out prompt (60 % of their words shared)."""
    used = {r["messages"][-1]["content"] for r in round4_rows if len(r["messages"]) == 1}
    numbers = [r4._user(x) for x in _fill(rng, 900, t4.number_problem) if x not in used]
    groups = [
        ("code", "code", code_reading(rng, tokenizer, 500)),
        ("edit", "instructions", sentence_editing(rng, tokenizer, 450)),
        ("cont", "stories", story_continuations(rng, tokenizer, 350)),
        ("read", "summaries", unused_reading(rng, tokenizer, round4_rows)),
        ("num", "math", numbers[:250]),
        ("third", "multi-turn", third_turns(rng, tokenizer, round4_rows, 450)),
    ]
    rows = r4.kept_rows(groups, held_texts, used, prefix="t5")
    rng.shuffle(rows)
    return rows
