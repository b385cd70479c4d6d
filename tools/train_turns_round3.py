"""Round 3 of `train-turns`: single-turn everyday requests of the held-out kinds that rounds 1
and 2 (conversation turns, passages, wiki topics) did not make:

- instructions: how-to requests, lists, sets of animals / foods / countries to sort or describe;
- chat: questions about animals, everyday machines, "why" questions, wiki topics in new forms;
- stories and descriptions: characters in situations, scenes, short poems;
- code: pure-Python functions of the standard library to explain, test or rewrite, and small
  programming tasks in more languages;
- math: new word problems.

Slot lists and forms are in train_turns_round3_templates.py. The code snippets come from the
running Python's standard library (the committed answers: CPython 3.11.7).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import random
import re
import textwrap
from pathlib import Path

import train_turns_round3_templates as t3
from train_turns_templates import word_problem

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "dflash2_mlx" / "assets" / "prompts"


def _row(kind: str, category: str, i: int, text: str) -> dict:
    return {
        "id": f"t3-{kind}-{i:04d}",
        "category": category,
        "messages": [{"role": "user", "content": text}],
    }


def _fill(rng: random.Random, n: int, make) -> list[str]:
    """n distinct texts from make(rng) (fewer when it keeps repeating)."""
    out: dict[str, None] = {}
    for _ in range(n * 20):
        if len(out) == n:
            break
        out[make(rng)] = None
    return list(out)


def _instructions(rng: random.Random) -> list[str]:
    howto = _fill(rng, 350, lambda r: r.choice(t3.HOWTO_FORMS).format(a=r.choice(t3.ACTIVITIES)))
    lists = _fill(
        rng,
        350,
        lambda r: r.choice(t3.LIST_FORMS).format(
            n=r.choice([3, 4, 5, 6, 7, 10]), x=r.choice(t3.LIST_THINGS)
        ),
    )
    return howto + lists + _fill(rng, 150, _set_request)


def _set_request(rng: random.Random) -> str:
    form = rng.choice(t3.SET_FORMS)
    a, b = rng.sample(sorted(t3.GROUPS), 2)
    animals = rng.sample(t3.GROUPS[a], 3) + rng.sample(t3.GROUPS[b], 2)
    rng.shuffle(animals)
    foods = rng.sample(t3.FOODS["fruits"], 3) + rng.sample(t3.FOODS["vegetables"], 3)
    rng.shuffle(foods)
    return form.format(
        a=a,
        b=b,
        items=", ".join(animals if "{a}" in form else animals[:3]),
        foods=", ".join(foods),
        countries=", ".join(rng.sample(t3.COUNTRIES, rng.choice([3, 4, 5]))),
    )


def _chat(rng: random.Random, wiki_titles: list[str]) -> list[str]:
    animals = _fill(rng, 150, lambda r: r.choice(t3.ANIMAL_FORMS).format(x=r.choice(t3.ANIMALS)))
    objects = _fill(rng, 60, lambda r: r.choice(t3.OBJECT_FORMS).format(x=r.choice(t3.OBJECTS)))
    topics = [rng.choice(t3.WIKI_CHAT_FORMS).format(t=t) for t in rng.sample(wiki_titles, 200)]
    return animals + objects + list(t3.WHY_QUESTIONS) + topics


def _stories(rng: random.Random) -> list[str]:
    stories = _fill(
        rng,
        250,
        lambda r: r.choice(t3.STORY_FORMS).format(
            c=r.choice(t3.CHARACTERS), s=r.choice(t3.SITUATIONS)
        ),
    )
    scenes = [f.format(s=s) for f in t3.SCENE_FORMS for s in t3.SCENES]
    return stories + rng.sample(scenes, 120)


def _without_docstring(src: str) -> str:
    fn = ast.parse(src).body[0]
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        lines = src.splitlines(keepends=True)
        del lines[body[0].lineno - 1 : body[0].end_lineno]
        src = "".join(lines)
    return src


def _snippets() -> list[str]:
    """Sources of small pure-Python module-level functions (5-25 lines, docstrings removed)."""
    out = []
    for name in t3.SNIPPET_MODULES:
        mod = importlib.import_module(name)
        for attr, obj in sorted(vars(mod).items()):
            if not inspect.isfunction(obj) or obj.__module__ != mod.__name__:
                continue
            try:
                src = _without_docstring(textwrap.dedent(inspect.getsource(obj)))
            except (OSError, SyntaxError, IndexError):
                continue
            if 5 <= len(src.splitlines()) <= 25 and len(src) <= 900:
                out.append(src)
    return out


def _code(rng: random.Random) -> list[str]:
    snippets = _snippets()
    texts = [
        rng.choice(t3.SNIPPET_FORMS).format(src=s)
        for s in rng.sample(snippets, min(250, len(snippets)))
    ]
    tasks = [
        f.format(lang=lang, task=task)
        for f in t3.NEW_CODE_FORMS
        for lang in t3.CODE_LANGS
        for task in t3.NEW_CODE_TASKS
    ]
    return texts + rng.sample(tasks, 200)


def _near(text: str, held: list[set[str]]) -> bool:
    words = set(re.findall(r"[a-z]+", text.lower()))
    return any(len(words & h) >= 0.6 * len(words | h) for h in held)


def round3(
    rng: random.Random, topics: list[str], used_texts: set[str], held_texts: set[str]
) -> list[dict]:
    """Round 3's prompts minus any text already used (rounds 1-2, the training splits) and any
    close to a held-out prompt (60 % of their words shared). topics: wiki topic names that
    no earlier prompt mentions."""
    kinds = [
        ("instr", "instructions", _instructions(rng)),
        ("chat", "chat", _chat(rng, topics)),
        ("story", "stories", _stories(rng)),
        ("code", "code", _code(rng)),
        ("math", "math", _fill(rng, 200, word_problem)),
    ]
    held = [set(re.findall(r"[a-z]+", h.lower())) for h in held_texts]
    out = []
    for kind, category, texts in kinds:
        kept = [x for x in texts if x not in used_texts and not _near(x, held)]
        out += [_row(kind, category, i, x) for i, x in enumerate(kept)]
    rng.shuffle(out)
    return out


def training_texts() -> set[str]:
    """The last user turn of every prompt in the bundled training splits."""
    texts = set()
    for path in PROMPTS.glob("train*.jsonl"):
        for line in path.read_text().splitlines():
            texts.add(json.loads(line)["messages"][-1]["content"])
    return texts
