"""Build `train-turns`: new training prompts of the held-out kinds from material already on disk.

- follow-ups: a hand-written prompt, the target's own greedy answer to it (a bundled
  regeneration that ended before the 256-token cap), then one follow-up turn of its kind;
- passages: a Wikipedia summary or a Python documentation chunk (from `dflash2 corpus`) with a
  reading task (summarize, main point, title, facts, rewrite, questions) before or after it;
- topics: chat and instruction requests about the Wikipedia level-4 vital article titles;
- code: questions about the installed Python standard library's public functions, and small
  programming tasks in several languages;
- math: word problems from templates with random numbers and names.

Texts that equal a held-out prompt are dropped. Deterministic (seeded):

    dflash2 corpus --out corpus --sources wiki,python-docs
    python tools/make_train_turns.py --corpus corpus --out train-turns.jsonl
    # the prompts answered in data/smollm2/regen_train-turns.jsonl (2,050 of the 2,800):
    python tools/make_train_turns.py --corpus corpus --out train-turns.jsonl \
        --answered data/smollm2/regen_train-turns.jsonl
    # round 2 (train_turns_round2.py): third turns, chitchat second turns, and the passages,
    # topics and code round 1 did not use (needs chitchat in the corpus folder):
    dflash2 corpus --out corpus --sources wiki,python-docs,chitchat
    python tools/make_train_turns.py --corpus corpus --out train-turns2.jsonl --round 2
    # round 3 (train_turns_round3.py): single-turn everyday requests, none of rounds 1-2's texts:
    python tools/make_train_turns.py --corpus corpus --out train-turns3.jsonl --round 3
    # round 4 (train_turns_round4.py): reading tasks over the target's own answers, second turns
    # on round 3, new numeric, factual, story and coding forms (no corpus folder needed):
    python tools/make_train_turns.py --out train-turns4.jsonl --round 4
    # round 5 (train_turns_round5.py): code reading, sentence editing, story continuations over
    # the target's own answers, more numbers, third turns on round 4 (its answers in data/smollm2):
    python tools/make_train_turns.py --out train-turns5.jsonl --round 5
    # round 6 (train_turns_round6.py): chitchat conversations cut after a later user turn, the
    # humans' own earlier turns kept (needs chitchat in the corpus folder):
    dflash2 corpus --out corpus --sources chitchat
    python tools/make_train_turns.py --corpus corpus --out train-turns6.jsonl --round 6
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import re
from pathlib import Path

import train_turns_round2 as round2
import train_turns_round3 as round3
import train_turns_round4 as round4
import train_turns_round5 as round5
import train_turns_round6 as round6
from train_turns_templates import (
    CODE_FORMS,
    CODE_LANGUAGES,
    CODE_TASKS,
    FOLLOW_UPS,
    PASSAGE_TASKS,
    STDLIB_FORMS,
    STDLIB_MODULES,
    TOPIC_TASKS,
    word_problem,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "dflash2_mlx" / "assets" / "prompts"
REGEN = ROOT / "data" / "smollm2"


def _follow_ups(rng: random.Random, n: int, tokenizer) -> list[dict]:
    texts = {}
    for split in ("train-broad", "train-deep", "train-wide", "train"):
        for line in (PROMPTS / f"{split}.jsonl").read_text().splitlines():
            p = json.loads(line)
            if len(p["messages"]) == 1:
                texts[p["id"]] = p
    pool = []
    for name in (
        "regen_train-broad.jsonl",
        "regen_train-deep.jsonl",
        "regen_train-wide.jsonl",
        "regen_train.jsonl",
    ):
        for line in (REGEN / name).read_text().splitlines():
            r = json.loads(line)
            p = texts.get(r["id"])
            if (
                p
                and r["temperature"] == 0.0
                and len(r["response_ids"]) < 256
                and p["category"] in FOLLOW_UPS
            ):
                pool.append((p, r["response_ids"]))
    rng.shuffle(pool)
    out = []
    for i, (p, ids) in enumerate(pool[:n]):
        answer = tokenizer.decode(ids, skip_special_tokens=True).strip()
        follow = rng.choice(FOLLOW_UPS[p["category"]])
        messages = p["messages"] + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": follow},
        ]
        out.append({"id": f"t-follow-{i:04d}", "category": "multi-turn", "messages": messages})
    return out


def _passages(rng: random.Random, corpus: Path, n_wiki: int, n_docs: int) -> list[dict]:
    out = []
    for source, n in (("wiki", n_wiki), ("python-docs", n_docs)):
        rows = [json.loads(x) for x in (corpus / f"{source}.jsonl").read_text().splitlines()]
        rows = [r for r in rows if 200 <= len(r["messages"][-1]["content"]) <= 1400]
        for r in rng.sample(rows, n):
            text, task = r["messages"][-1]["content"].strip(), rng.choice(PASSAGE_TASKS)
            content = f"{task}\n\n{text}" if rng.random() < 0.5 else f"{text}\n\n{task}"
            out.append(
                {
                    "id": f"t-{source}-{len(out):04d}",
                    "category": "summaries",
                    "messages": [{"role": "user", "content": content}],
                }
            )
    return out


def _topic_name(title: str, summary: str) -> str:
    """'Human brain' -> 'the human brain' when the summary writes it so; proper names stay."""
    lower = title[:1].lower() + title[1:]
    m = re.search(rf"\b((?i:the|a|an)) {re.escape(lower)}\b", summary)
    if m:
        return f"{m.group(1).lower()} {lower}"
    return lower if re.search(rf"\b{re.escape(lower)}\b", summary) else title


def _topics(rng: random.Random, corpus: Path, n: int) -> list[dict]:
    rows = [json.loads(x) for x in (corpus / "wiki.jsonl").read_text().splitlines()]
    pairs = [(r["id"].split("/", 1)[1], r["messages"][-1]["content"]) for r in rows]
    pairs = [p for p in pairs if re.fullmatch(r"[A-Za-z][A-Za-z '-]{2,30}", p[0])]
    out = []
    for i, (title, summary) in enumerate(rng.sample(pairs, n)):
        category = rng.choice(["chat", "instructions"])
        text = rng.choice(TOPIC_TASKS[category]).format(t=_topic_name(title, summary))
        out.append(
            {
                "id": f"t-topic-{i:04d}",
                "category": category,
                "messages": [{"role": "user", "content": text}],
            }
        )
    return out


def _stdlib_names() -> list[str]:
    names = []
    for mod_name in STDLIB_MODULES:
        mod = importlib.import_module(mod_name)
        for attr, obj in vars(mod).items():
            if attr.startswith("_") or not (
                inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)
            ):
                continue
            if (getattr(obj, "__module__", None) or "").lstrip("_").split(".")[0] == mod_name.split(
                "."
            )[0].lstrip("_"):
                names.append(f"{mod_name}.{attr}")
    return sorted(set(names))


def _code(rng: random.Random, n_stdlib: int, n_tasks: int) -> list[dict]:
    out = []
    for name in rng.sample(_stdlib_names(), n_stdlib):
        out.append(rng.choice(STDLIB_FORMS).format(name=name))
    combos = [(f, lang, task) for f in CODE_FORMS for lang in CODE_LANGUAGES for task in CODE_TASKS]
    for form, lang, task in rng.sample(combos, n_tasks):
        out.append(form.format(lang=lang, task=task))
    return [
        {"id": f"t-code-{i:04d}", "category": "code", "messages": [{"role": "user", "content": t}]}
        for i, t in enumerate(out)
    ]


def _maths(rng: random.Random, n: int) -> list[dict]:
    maths = []
    while len(maths) < n:
        t = word_problem(rng)
        if t not in maths:
            maths.append(t)
    return [
        {"id": f"t-math-{i:04d}", "category": "math", "messages": [{"role": "user", "content": t}]}
        for i, t in enumerate(maths)
    ]


def _round2(rng: random.Random, corpus: Path, round1: list[dict], tokenizer, held) -> list[dict]:
    rows = round2.third_turns(rng, round1, 450, tokenizer)
    rows += round2.chitchat_second_turns(rng, corpus, 450, tokenizer)
    rows += round2.unused(_passages(rng, corpus, 900, 300), round1, "passage", 400)
    rows += round2.unused(_topics(rng, corpus, 1000), round1, "topic", 400)
    rows += round2.unused(_code(rng, 450, 200), round1, "code", 300)
    rows += round2.unused(_maths(rng, 600), round1, "math", 200)
    rows = [r for r in rows if r["messages"][-1]["content"] not in held]
    rng.shuffle(rows)
    return rows


def _unused_topics(corpus: Path, texts: set[str]) -> list[str]:
    """Wiki topic names (as _topics writes them) that none of these texts mentions."""
    rows = [json.loads(x) for x in (corpus / "wiki.jsonl").read_text().splitlines()]
    pairs = [(r["id"].split("/", 1)[1], r["messages"][-1]["content"]) for r in rows]
    names = [_topic_name(t, s) for t, s in pairs if re.fullmatch(r"[A-Za-z][A-Za-z '-]{2,30}", t)]
    joined = "\n".join(texts).lower()
    return [n for n in names if n.lower() not in joined]


def _round3(rng: random.Random, corpus: Path, earlier: list[dict], held) -> list[dict]:
    used = round3.training_texts() | {r["messages"][-1]["content"] for r in earlier}
    return round3.round3(rng, _unused_topics(corpus, used), used, held)


def _rounds_1_to_3(args, tokenizer, held: set[str]) -> list[dict]:
    rng = random.Random(args.seed)
    rows = _follow_ups(rng, 900, tokenizer)
    rows += _passages(rng, args.corpus, 450, 150)
    rows += _topics(rng, args.corpus, 500)
    rows += _code(rng, 250, 250)
    rows += _maths(rng, 300)
    rows = [r for r in rows if r["messages"][-1]["content"] not in held]
    rng.shuffle(rows)
    if args.round == 1:
        return rows
    round2_rows = _round2(random.Random(args.seed + 1), args.corpus, rows, tokenizer, held)
    if args.round == 2:
        return round2_rows
    return _round3(random.Random(args.seed + 2), args.corpus, rows + round2_rows, held)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--corpus",
        type=Path,
        help="a `dflash2 corpus` folder with wiki and python-docs (rounds 1-3)",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument(
        "--round",
        type=int,
        choices=(1, 2, 3, 4, 5, 6),
        default=1,
        help="2: the prompts round 1 did not make (train_turns_round2.py); needs the target's "
        "answers to round 1 in data/smollm2 and chitchat.jsonl in the corpus folder; "
        "3: single-turn everyday requests that rounds 1-2 did not make (train_turns_round3.py); "
        "4: reading tasks, second turns on round 3 and new forms (train_turns_round4.py); "
        "5: tasks over the target's own answers, third turns on round 4 (train_turns_round5.py); "
        "6: chitchat conversations cut after a later user turn (train_turns_round6.py)",
    )
    ap.add_argument(
        "--answered",
        type=Path,
        help="keep only the prompts with an answer in this regeneration file",
    )
    args = ap.parse_args()
    if (args.round < 4 or args.round == 6) and args.corpus is None:
        ap.error(f"--round {args.round} needs --corpus")
    from dflash2_mlx.embedded import ensure_smollm2  # before mlx_lm: it binds the BLAS
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(ensure_smollm2())
    held = {
        json.loads(x)["messages"][-1]["content"]
        for x in (PROMPTS / "heldout.jsonl").read_text().splitlines()
    }
    if args.round == 6:
        rows = round6.round6(random.Random(args.seed + 5), args.corpus, held)
    elif args.round >= 4:
        rows = round4.round4(random.Random(args.seed + 3), tokenizer, held)
        if args.round == 5:
            rows = round5.round5(random.Random(args.seed + 4), tokenizer, held, rows)
    else:
        rows = _rounds_1_to_3(args, tokenizer, held)
    if args.answered:
        answered = {json.loads(x)["id"] for x in args.answered.read_text().splitlines()}
        rows = [r for r in rows if r["id"] in answered]
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
