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
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "dflash2_mlx" / "assets" / "prompts"
REGEN = ROOT / "data" / "smollm2"

FOLLOW_UPS = {
    "chat": [
        "Can you explain that to a ten-year-old?",
        "Give me a real-life example.",
        "Summarize that in one sentence.",
        "Why is that?",
        "What is a common misconception about this?",
        "Can you make that shorter?",
        "What else should I know about it?",
        "Can you put that in a table?",
        "How would I explain this to a friend?",
        "What are the pros and cons?",
    ],
    "instructions": [
        "Can you make it shorter?",
        "Now turn that into a numbered checklist.",
        "Rewrite it in a more formal tone.",
        "Rewrite it in a friendlier tone.",
        "Add one more tip at the end.",
        "Which step is the most important, and why?",
        "Can you give it a title?",
        "Make it suitable for a beginner.",
    ],
    "code": [
        "Can you add comments to that code?",
        "How would I test this?",
        "Can you make it shorter?",
        "What happens if the input is empty?",
        "Explain the code line by line.",
        "Can you write the same thing in JavaScript?",
        "What is the time complexity?",
        "Add error handling to it.",
    ],
    "math": [
        "Can you check that answer another way?",
        "What if all the numbers were doubled?",
        "Explain the steps more simply.",
        "Can you write that as a single equation?",
        "Give me a similar problem to practise.",
        "How would I explain this to a child?",
    ],
    "stories": [
        "Give the story a different ending.",
        "Give it a title.",
        "Make it shorter, about half as long.",
        "Tell it again from another character's point of view.",
        "What is the moral of the story?",
        "Continue the story.",
        "Turn it into a short poem.",
    ],
    "summaries": [
        "Make it even shorter: one sentence.",
        "What is the most important detail?",
        "Write it as three bullet points.",
        "Explain it to a child.",
        "Give it a title.",
    ],
}

PASSAGE_TASKS = [
    "Summarize this in two sentences.",
    "Summarize this in one sentence.",
    "What is the main point of this paragraph?",
    "Give this text a short title.",
    "List three facts from this text.",
    "Rewrite this for a ten-year-old.",
    "Write two questions a student could answer from this text, with the answers.",
    "Summarize the text in three bullet points.",
    "Briefly, what is this about?",
    "Explain this in simple words.",
]

TOPIC_TASKS = {
    "chat": [
        "What is {t}?",
        "Why is {t} important?",
        "Tell me something interesting about {t}.",
        "Can you explain {t} simply?",
        "What should everyone know about {t}?",
        "How would you describe {t} to someone who has never heard of it?",
    ],
    "instructions": [
        "Give me five facts about {t}.",
        "Write a short paragraph about {t}.",
        "Explain {t} to a child in three sentences.",
        "Write three quiz questions about {t}, with answers.",
        "List the key points about {t} as bullet points.",
        "Write a short introduction to {t} for a school report.",
        "Give me a one-sentence definition of {t} and an example.",
    ],
}

CODE_TASKS = [
    "reverses a string",
    "checks whether a string is a palindrome",
    "counts the words in a sentence",
    "returns the largest number in a list",
    "removes duplicates from a list",
    "merges two sorted lists",
    "converts Celsius to Fahrenheit",
    "checks whether a year is a leap year",
    "returns the n-th Fibonacci number",
    "counts how often each letter appears in a string",
    "finds the second largest number in a list",
    "capitalizes the first letter of every word",
    "checks whether two strings are anagrams",
    "flattens a nested list",
    "returns the sum of the even numbers in a list",
    "rounds a price to two decimal places",
    "validates a simple email address",
    "computes the average of the values in a dictionary",
    "splits a list into pairs",
    "returns the digits of a number as a list",
]
CODE_LANGUAGES = ["Python", "JavaScript", "Java", "C", "Go", "Rust", "TypeScript", "Ruby"]
CODE_FORMS = [
    "Write a {lang} function that {task}.",
    "How do I write a {lang} function that {task}?",
    "Show me a short {lang} example that {task}, with comments.",
]
STDLIB_FORMS = [
    "What does `{name}` do in Python? Show a short example.",
    "How do I use `{name}` in Python?",
    "Explain `{name}` from the Python standard library with an example.",
]
STDLIB_MODULES = [
    "os.path",
    "json",
    "re",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "collections",
    "datetime",
    "string",
    "textwrap",
    "shutil",
    "glob",
    "csv",
    "pathlib",
    "heapq",
    "bisect",
    "operator",
    "fractions",
    "decimal",
    "time",
    "calendar",
    "urllib.parse",
    "hashlib",
    "base64",
    "uuid",
    "difflib",
    "copy",
    "zipfile",
    "sqlite3",
    "subprocess",
]

NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Isla",
    "Jonas",
    "Kemi",
    "Leo",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tariq",
]
ITEMS = ["apples", "pencils", "stickers", "books", "cookies", "marbles", "stamps", "shells"]


def _math(rng: random.Random) -> str:
    n, m = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 9)
    h1, m1, dh, dm = (
        rng.randint(6, 11),
        rng.choice([0, 10, 15, 25, 40, 45]),
        rng.randint(1, 5),
        rng.randint(5, 55),
    )
    templates = [
        f"{n} has {a} {m} and gives {b % a or 1} away. Then {n} buys {c} packs of {b} {m}. How many {m} does {n} have now?",
        f"A shop sells {m} at ${c} each. {n} buys {a} of them and pays with ${(a * c // 50 + 1) * 50}. How much change does {n} get?",
        f"A train leaves at {h1}:{m1:02d} am and the trip takes {dh} hours and {dm} minutes. When does it arrive?",
        f"What is {a}% of {b * 20}?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"{n} reads {c} pages a day. How many days does a {a * c + b % c} page book take?",
        f"What is the greatest common divisor of {a * c} and {b * c}?",
        f"A car drives {a * c} km in {c} hours. What is its average speed?",
        f"The average of three numbers is {a}. Two of them are {b} and {c}. What is the third?",
        f"Convert {a * 100} grams to kilograms and {b} kilometres to metres.",
        f"A price of ${a * 4} is reduced by {rng.choice([10, 15, 20, 25, 30])}%. What is the new price?",
        f"What is {a}/{a + b} + {c}/{a + b}, in lowest terms?",
        f"Solve for x: {c}x + {b} = {c * a + b}.",
        f"{n} saves ${c} a week. How many weeks until {n} has ${c * a}?",
        f"The temperature was {-c} degrees at night and {b} degrees at noon. How much did it rise?",
    ]
    return rng.choice(templates)


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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--corpus",
        type=Path,
        required=True,
        help="a `dflash2 corpus` folder with wiki and python-docs",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument(
        "--answered",
        type=Path,
        help="keep only the prompts with an answer in this regeneration file",
    )
    args = ap.parse_args()
    from dflash2_mlx.embedded import ensure_smollm2  # before mlx_lm: it binds the BLAS
    from mlx_lm.utils import load_tokenizer

    rng = random.Random(args.seed)
    rows = _follow_ups(rng, 900, load_tokenizer(ensure_smollm2()))
    rows += _passages(rng, args.corpus, 450, 150)
    rows += _topics(rng, args.corpus, 500)
    rows += _code(rng, 250, 250)
    maths = []
    while len(maths) < 300:
        t = _math(rng)
        if t not in maths:
            maths.append(t)
    rows += [
        {"id": f"t-math-{i:04d}", "category": "math", "messages": [{"role": "user", "content": t}]}
        for i, t in enumerate(maths)
    ]
    held = {
        json.loads(x)["messages"][-1]["content"]
        for x in (PROMPTS / "heldout.jsonl").read_text().splitlines()
    }
    rows = [r for r in rows if r["messages"][-1]["content"] not in held]
    rng.shuffle(rows)
    if args.answered:
        answered = {json.loads(x)["id"] for x in args.answered.read_text().splitlines()}
        rows = [r for r in rows if r["id"] in answered]
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
