"""Round 4 of `train-turns`: prompts of the held-out kinds built on the target's own answers and
on new templates, none of rounds 1-3's texts:

- reading tasks over everyday texts: an answer the target wrote itself (a story, a how-to, an
  explanation; greedy, ended before the 256-token cap) with a summary or reading task before or
  after it (sometimes the bare text), and short product reviews and letters made from slots;
- second turns on round 3: a round-3 request, the target's greedy answer to it, then a
  follow-up of its kind;
- numeric word problems of new kinds (percentages, multiples, rounding, fractions, clock times,
  rates, measures, equations), short factual questions, stories that begin or end with a given
  line, and coding questions (concepts, comparisons, SQL, shell, HTML/CSS).

Needs no corpus folder: the round-3 requests are read back from their regeneration file's
prompt ids. Wording in train_turns_round4_templates.py.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import train_turns_round4_templates as t4
from train_turns_round3 import _fill, _near, training_texts
from train_turns_templates import FOLLOW_UPS

ROOT = Path(__file__).resolve().parents[1]
REGEN = ROOT / "data" / "smollm2"
ROUND3 = REGEN / "regen_train-turns3.jsonl"
USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
# The answer files round 4 drew on (named, so files added later do not change its prompts).
ROUND4_SOURCES = [
    f"regen_{name}.jsonl"
    for name in (
        "corpus-chat-partial corpus-chat-rest extra-more-t07 train-broad-t05 "
        "train-broad-t07-partial train-broad-t07-rest train-broad train-deep-t07-partial "
        "train-deep-t07-rest train-deep train-extra train-more train-rest-t05-partial "
        "train-t07 train-turns-rest train-turns train-turns2 train-turns3 train-wide-t07 "
        "train-wide train"
    ).split()
]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _finished(record: dict) -> bool:
    return record["temperature"] == 0.0 and record.get("finish_reason") == "stop"


def own_texts(tokenizer, sources=ROUND4_SOURCES, low: int = 60, high: int = 230) -> list[str]:
    """The target's own greedy answers (chat, instructions, stories) of low..high tokens that
    ended by themselves, without code, deduplicated, from these data/smollm2 files."""
    texts: dict[str, None] = {}
    for name in sources:
        for line in (REGEN / name).read_text().splitlines():
            r = json.loads(line)
            n = len(r["response_ids"])
            if not (_finished(r) and low <= n <= high):
                continue
            if r["category"] not in ("chat", "instructions", "stories"):
                continue
            text = tokenizer.decode(r["response_ids"], skip_special_tokens=True).strip()
            if "```" not in text:
                texts[text] = None
    return list(texts)


def reading_tasks(rng: random.Random, texts: list[str], n: int) -> list[list[dict]]:
    out = []
    for text in rng.sample(texts, min(n, len(texts))):
        task = rng.choice(t4.READING_TASKS)
        roll = rng.random()
        content = (
            text if roll < 0.15 else f"{task}\n\n{text}" if roll < 0.6 else f"{text}\n\n{task}"
        )
        out.append(_user(content))
    return out


def everyday_tasks(rng: random.Random, n: int) -> list[list[dict]]:
    out = []
    for _ in range(n):
        text = t4.review(rng) if rng.random() < 0.5 else t4.letter(rng)
        task = rng.choice(t4.EVERYDAY_TASKS + t4.READING_TASKS[:6])
        out.append(_user(f"{task}\n\n{text}" if rng.random() < 0.6 else f"{text}\n\n{task}"))
    return out


def second_turns(rng: random.Random, tokenizer, n: int) -> list[list[dict]]:
    """Round-3 requests, the target's greedy answers to them, then a follow-up of their kind."""
    pool = []
    for line in ROUND3.read_text().splitlines():
        r = json.loads(line)
        turns = USER_TURN.findall(tokenizer.decode(r["prompt_ids"]))
        if _finished(r) and len(turns) == 1 and r["category"] in FOLLOW_UPS:
            pool.append((turns[0], r))
    out = []
    for question, r in rng.sample(pool, min(n, len(pool))):
        answer = tokenizer.decode(r["response_ids"], skip_special_tokens=True).strip()
        follow = rng.choice(FOLLOW_UPS[r["category"]])
        out.append(
            _user(question)
            + [{"role": "assistant", "content": answer}, {"role": "user", "content": follow}]
        )
    return out


def single_turns(rng: random.Random) -> list[tuple[str, str, str]]:
    """(kind, category, text) of the new single-turn families."""
    rows = [("num", "math", x) for x in _fill(rng, 320, t4.number_problem)]
    rows += [("fact", "chat", f.format(x=x)) for f, xs in t4.FACT_FORMS.items() for x in xs]
    stories = [f.format(o=o, e="") for f in t4.STORY_LINE_FORMS if "{o}" in f for o in t4.OPENINGS]
    stories += [f.format(e=e) for f in t4.STORY_LINE_FORMS if "{e}" in f for e in t4.ENDINGS]
    stories += [f.format(s=s) for f in t4.STORY_SUBJECT_FORMS for s in t4.STORY_SUBJECTS]
    rows += [("story", "stories", x) for x in stories]
    code = [f.format(x=x) for f in t4.CONCEPT_FORMS for x in t4.CONCEPTS]
    code += [f.format(x=x) for f in t4.PAIR_FORMS for x in t4.PAIRS]
    for form, tasks in zip(t4.TASK_FORMS, (t4.SQL_TASKS, t4.SHELL_TASKS, t4.WEB_TASKS)):
        code += [form.format(t=t) for t in tasks]
    rows += [("code", "code", x) for x in code]
    return rows


def round4(rng: random.Random, tokenizer, held_texts: set[str]) -> list[dict]:
    """Round 4's prompts minus any single-turn text a training split already has or close to a
    held-out prompt (60 % of their words shared). Rounds 1-3 made none of these forms."""
    groups = [
        ("read", "summaries", reading_tasks(rng, own_texts(tokenizer), 800)),
        ("everyday", "summaries", everyday_tasks(rng, 150)),
        ("second", "multi-turn", second_turns(rng, tokenizer, 650)),
    ]
    groups += [(kind, category, [_user(x)]) for kind, category, x in single_turns(rng)]
    rows = kept_rows(groups, held_texts, set(), prefix="t4")
    rng.shuffle(rows)
    return rows


def kept_rows(groups, held_texts: set[str], used: set[str], prefix: str) -> list[dict]:
    """Rows {prefix}-{kind}-NNNN of (kind, category, conversations) groups, dropping single-turn
    texts already in a training split, in `used` or earlier in the groups, and those close to a
    held-out prompt (60 % of their words shared)."""
    held = [set(re.findall(r"[a-z]+", h.lower())) for h in held_texts]
    out, seen, counts = [], training_texts() | used, {}
    for kind, category, conversations in groups:
        for messages in conversations:
            last = messages[-1]["content"]
            if len(messages) == 1 and (last in seen or _near(last, held)):
                continue
            seen.add(last)
            counts[kind] = counts.get(kind, -1) + 1
            out.append(
                {
                    "id": f"{prefix}-{kind}-{counts[kind]:04d}",
                    "category": category,
                    "messages": messages,
                }
            )
    return out
