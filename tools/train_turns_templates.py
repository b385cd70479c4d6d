"""The wording `make_train_turns.py` draws from: follow-up turns by kind, reading tasks, topic
requests, coding tasks and forms, standard-library modules, and templated word problems."""

import random

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


def word_problem(rng: random.Random) -> str:
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
