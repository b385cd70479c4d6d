"""Build dflash2_mlx/assets/prompts/train-extra.jsonl and train-more.jsonl: template-built training
prompts (topics x instruction templates, coding tasks, story seeds, arithmetic word problems,
short follow-ups) that add variety to the hand-written `train` split for drafter distillation.
`train-more` uses only combinations `train-extra` did not (it was added later; train-extra's file
is unchanged by it). Prompts whose text is in the held-out split are dropped. Deterministic
(seeded): `python tools/make_train_extra.py`."""

import collections
import itertools
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "dflash2_mlx" / "assets" / "prompts"
rng = random.Random(7)
topics = [
    "volcanoes",
    "the water cycle",
    "black holes",
    "photosynthesis",
    "the Roman Empire",
    "honeybees",
    "electric cars",
    "the internet",
    "vaccines",
    "earthquakes",
    "the stock market",
    "climate change",
    "the human heart",
    "rainforests",
    "glaciers",
    "the printing press",
    "solar panels",
    "coral reefs",
    "the moon landing",
    "dinosaurs",
    "recycling",
    "sleep",
    "the immune system",
    "tides",
    "democracy",
    "coffee",
    "chess",
    "the Olympic Games",
    "bread baking",
    "compound interest",
    "wind turbines",
    "octopuses",
    "the Great Wall of China",
    "batteries",
    "migration of birds",
    "the pyramids of Egypt",
    "antibiotics",
    "the periodic table",
    "rainbows",
    "the speed of light",
    "magnets",
    "hurricanes",
    "deserts",
    "the French Revolution",
    "jazz music",
    "origami",
    "nuclear energy",
    "the Amazon river",
    "penguins",
    "time zones",
    "credit cards",
    "3D printing",
    "the Renaissance",
    "yoga",
    "gardening",
    "bicycles",
    "telescopes",
    "the Silk Road",
    "friction",
    "gravity",
    "clouds",
    "mushrooms",
    "whales",
    "cheese making",
    "the Industrial Revolution",
    "robots",
    "smartphones",
    "public libraries",
    "elections",
    "inflation",
    "tea",
    "the brain",
    "sound waves",
    "mountains",
    "rivers",
    "snowflakes",
    "lightning",
    "fossils",
    "comets",
    "DNA",
    "bridges",
    "airplanes",
    "submarines",
]
people = [
    "Anna",
    "Ben",
    "Carlos",
    "Dina",
    "Eli",
    "Fatima",
    "George",
    "Hana",
    "Ivan",
    "Julia",
    "Kofi",
    "Lena",
    "Marco",
    "Nora",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
]
things = [
    "apples",
    "pencils",
    "marbles",
    "stickers",
    "cookies",
    "books",
    "coins",
    "flowers",
    "cards",
    "balloons",
]
langs = ["Python", "JavaScript", "Python", "C", "Java", "Python", "Rust", "Go"]
tasks = [
    "reverses a string",
    "checks whether a number is prime",
    "returns the largest element of a list",
    "counts the vowels in a string",
    "computes the factorial of n",
    "merges two sorted lists",
    "removes duplicates from a list",
    "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit",
    "computes the nth Fibonacci number",
    "sums the digits of an integer",
    "finds the second smallest number in a list",
    "counts words in a sentence",
    "returns the average of a list of numbers",
    "capitalizes the first letter of every word",
    "flattens a nested list",
    "checks whether two strings are anagrams",
    "computes the greatest common divisor of two numbers",
    "returns the list of even numbers from a list",
    "finds the most frequent character in a string",
    "implements binary search",
    "sorts a list with bubble sort",
    "reads a file and counts its lines",
    "generates all permutations of a string",
    "converts a binary string to an integer",
    "rotates a list by k positions",
]
chars = [
    "a brave mouse",
    "a lonely robot",
    "a young wizard",
    "a curious cat",
    "an old lighthouse keeper",
    "a lost dragon",
    "a girl who could talk to trees",
    "a clumsy knight",
    "a tiny turtle",
    "a pirate who was afraid of water",
    "a talking teapot",
    "a boy who found a magic key",
    "a friendly ghost",
    "an astronaut on Mars",
    "a baker in a small village",
    "a fox and a crow",
]
settings = [
    "in a snowy forest",
    "on a distant planet",
    "at the bottom of the sea",
    "in a busy city",
    "in an enchanted castle",
    "during a thunderstorm",
    "in a small fishing village",
    "on a train across the desert",
    "in a hidden garden",
    "at a school for magic",
]
chat_t = [
    "What is {t}?",
    "Can you explain {t} in simple terms?",
    "Why is {t} important?",
    "Tell me three interesting facts about {t}.",
    "How does {t} work?",
    "What would happen if there were no {t}?",
    "Give me a short history of {t}.",
    "What are the pros and cons of {t}?",
]
instr_t = [
    "Write a short guide on how to get started with {t}.",
    "List five tips for learning about {t}.",
    "Write a polite email asking a teacher for more information about {t}.",
    "Describe {t} to a ten-year-old.",
    "Write a product description for a book about {t}.",
    "Create a short quiz with three questions about {t}.",
    "Write a tweet about {t}.",
    "Give step-by-step instructions for explaining {t} to a friend.",
]
code_t = [
    "Write a {l} function that {k}.",
    "How do I write a {l} program that {k}?",
    "Show me {l} code that {k}, with comments.",
    "Explain how to write a function in {l} that {k}.",
]
story_t = [
    "Write a short story about {c} {s}.",
    "Tell me a bedtime story about {c} {s}.",
    "Write a poem about {c} {s}.",
    "Write the opening paragraph of a novel about {c} {s}.",
]
summ_t = [
    "Summarize the main ideas of {t} in three sentences.",
    "Write a one-paragraph summary of what people should know about {t}.",
    "Give a short summary of the history of {t}.",
]


def math_p():
    a, b, c = rng.randint(2, 40), rng.randint(2, 20), rng.randint(2, 9)
    p, q = rng.sample(people, 2)
    th = rng.choice(things)
    forms = [
        f"{p} has {a} {th}. {q} gives {p} {b} more. How many {th} does {p} have now?",
        f"{p} has {a + b} {th} and gives {b} to {q}. How many are left?",
        f"A box holds {c} {th}. How many {th} are in {b} boxes?",
        f"{p} reads {b} pages a day. How many pages does {p} read in {c} weeks?",
        f"A shirt costs ${a}. It is on sale for {c * 5}% off. What is the sale price?",
        f"{p} walks {c} kilometers every day. How far does {p} walk in {b} days?",
        f"What is {a} times {b} plus {c}?",
        f"If {c} friends share {a * c} {th} equally, how many does each friend get?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        f"{p} saves ${b} each week. How many weeks until {p} has ${b * a}?",
    ]
    return rng.choice(forms)


out, seen = [], set()
held = {json.loads(line)["messages"][-1]["content"] for line in open(ROOT / "heldout.jsonl")}


def add(cat, messages, prefix="x"):
    key = json.dumps(messages)
    if key in seen or messages[-1]["content"] in held:
        return
    seen.add(key)
    out.append({"id": f"{prefix}-{cat}-{len(out):04d}", "category": cat, "messages": messages})


for t in topics:
    for tmpl in rng.sample(chat_t, 3):
        add("chat", [{"role": "user", "content": tmpl.format(t=t)}])
    for tmpl in rng.sample(instr_t, 2):
        add("instructions", [{"role": "user", "content": tmpl.format(t=t)}])
    add("summaries", [{"role": "user", "content": rng.choice(summ_t).format(t=t)}])
for k in tasks:
    for lang in rng.sample(langs, 3):
        add("code", [{"role": "user", "content": rng.choice(code_t).format(l=lang, k=k)}])
for c, s in itertools.product(chars, settings):
    if rng.random() < 0.45:
        add("stories", [{"role": "user", "content": rng.choice(story_t).format(c=c, s=s)}])
for _ in range(130):
    add("math", [{"role": "user", "content": math_p()}])
for t in rng.sample(topics, 60):
    q1 = rng.choice(chat_t).format(t=t)
    add(
        "multi-turn",
        [
            {"role": "user", "content": q1},
            {
                "role": "assistant",
                "content": f"Sure! {t[0].upper() + t[1:]} is a big topic. Let me give you a short overview.",
            },
            {
                "role": "user",
                "content": rng.choice(
                    [
                        "Can you make it simpler?",
                        "Give me an example.",
                        "Why does that matter?",
                        "Can you summarize that in one sentence?",
                    ]
                ),
            },
        ],
    )
rng.shuffle(out)
print(len(out), collections.Counter(o["category"] for o in out))
with open(ROOT / "train-extra.jsonl", "w") as f:
    for o in out:
        f.write(json.dumps(o) + "\n")

# train-more: unused combinations only (`seen` still holds every train-extra prompt), weighted
# toward chat, instructions and summaries, the categories the first drafters accepted least.
out = []


def user(text):
    return [{"role": "user", "content": text}]


for t in topics:
    for tmpl in rng.sample(chat_t, 4):
        add("chat", user(tmpl.format(t=t)), "m")
    for tmpl in rng.sample(instr_t, 2):
        add("instructions", user(tmpl.format(t=t)), "m")
    for tmpl in rng.sample(summ_t, 1):
        add("summaries", user(tmpl.format(t=t)), "m")
out = rng.sample(out, 300)
for k in rng.sample(tasks, 20):
    add("code", user(rng.choice(code_t).format(l=rng.choice(langs), k=k)), "m")
for c, s in rng.sample(list(itertools.product(chars, settings)), 40):
    add("stories", user(rng.choice(story_t).format(c=c, s=s)), "m")
for _ in range(40):
    add("math", user(math_p()), "m")
for t in rng.sample(topics, 30):
    add(
        "multi-turn",
        user(rng.choice(chat_t).format(t=t))
        + [
            {
                "role": "assistant",
                "content": f"{t[0].upper() + t[1:]} is a fascinating subject. Here is the short version.",
            },
            {
                "role": "user",
                "content": rng.choice(
                    [
                        "Tell me more.",
                        "What is the most surprising part?",
                        "Explain it like I am five.",
                        "Can you give a real-world example?",
                    ]
                ),
            },
        ],
        "m",
    )
rng.shuffle(out)
print(len(out), collections.Counter(o["category"] for o in out))
with open(ROOT / "train-more.jsonl", "w") as f:
    for o in out:
        f.write(json.dumps(o) + "\n")
