"""Wording for round 4 of `train-turns` (train_turns_round4.py): reading tasks over everyday
texts, numeric word problems, short factual questions, story openings and endings, and coding
requests of kinds rounds 1-3 did not make. Slot lists are split at ";"."""

from __future__ import annotations

import random


def _items(text: str) -> list[str]:
    return [" ".join(x.split()) for x in text.split(";") if x.strip()]


# Put before or after a text the target wrote itself (a story, a how-to, an explanation).
READING_TASKS = [
    "Summarize this in one sentence.",
    "Summarize the text below in three sentences.",
    "Give me the gist of this text.",
    "What is this text about? Answer briefly.",
    "Write a short summary of this for a busy reader.",
    "Sum up the following in a few words.",
    "Shorten this text to about half its length.",
    "List the three most important points of this text.",
    "Write a one-line headline for this text.",
    "Explain this text to a seven-year-old.",
    "What is the main idea here?",
    "Turn this into a short bulleted summary.",
    "Can you condense this into two sentences?",
    "Rewrite this text in simpler words.",
]

# A new kind of everyday text to read: made from slots, then summarized or answered.
REVIEW_THINGS = _items(
    """
a pair of running shoes; a coffee maker; a wireless speaker; a backpack; an electric
toothbrush; a desk lamp; a rice cooker; a phone case; a winter jacket; a set of kitchen knives;
a yoga mat; a board game; a water bottle; a vacuum cleaner; a pair of headphones; a tent; an
office chair; a toaster; a paperback novel; a blender
"""
)
REVIEW_GOOD = _items(
    """
it arrived two days early and was well packed; it is light and easy to carry; the battery lasts
for days; it feels solid and well made; it was easy to set up without reading the manual; it
looks even better than in the photos; it is quiet; it was cheaper than similar ones I looked at;
my whole family likes using it; it is easy to clean
"""
)
REVIEW_BAD = _items(
    """
the instructions were confusing; one part broke after a month; it is louder than I expected;
the color faded after a few washes; it is a bit heavy; the strap is too short; it takes a long
time to warm up; customer service took a week to answer; the lid does not close tightly; it
scratches easily
"""
)
LETTER_PEOPLE = _items(
    """
Grandpa; Aunt Rosa; Mr. Patel; Coach Lee; Mrs. Okafor; Uncle Tom; Ms. Jensen; Dr. Alvarez;
Nana; Professor Kim
"""
)
LETTER_REASONS = _items(
    """
thank you for the books you sent for my birthday; I am sorry I missed your party last weekend;
thank you for helping me move into my new flat; I wanted to tell you that I passed my driving
test; thank you for teaching me to bake bread this summer; I am writing to ask if you can be a
reference for my job application; I hope you are feeling better after your operation; I wanted
to invite you to my graduation in June; thank you for looking after our cat while we were away;
I am writing to say how much I enjoyed your class this year
"""
)


def review(rng: random.Random) -> str:
    thing = rng.choice(REVIEW_THINGS)
    good = rng.sample(REVIEW_GOOD, 2)
    bad = rng.choice(REVIEW_BAD)
    stars = rng.choice([3, 4, 4, 5])
    return (
        f"I bought {thing} {rng.choice(['last month', 'a few weeks ago', 'in the spring'])}. "
        f"{good[0].capitalize()}, and {good[1]}. The only problem is that {bad}. "
        f"Overall I would give it {stars} stars out of 5."
    )


def letter(rng: random.Random) -> str:
    who, why = rng.choice(LETTER_PEOPLE), rng.choice(LETTER_REASONS)
    close = rng.choice(["Love", "Best wishes", "Warm regards", "With thanks", "See you soon"])
    name = rng.choice(["Sam", "Priya", "Leo", "Mia", "Jonas", "Aisha", "Ben", "Chloe"])
    return f"Dear {who}, {why}. It meant a lot to me. {close}, {name}"


EVERYDAY_TASKS = [
    "Please write a one-line summary of this review.",
    "Is this review positive or negative overall? Explain briefly.",
    "Summarize this message in one sentence.",
    "What is the writer asking for or saying here, in short?",
]

# Numeric problems of kinds the word-problem templates do not make.
NAMES = _items("Ana; Ben; Carla; Dev; Elif; Farid; Grace; Hugo; Ines; Jamal; Kira; Luis; Mei; Noah")


def number_problem(rng: random.Random) -> str:
    return rng.choice(_PROBLEMS)(rng)


def _percent(r: random.Random) -> str:
    p, n = r.choice([5, 10, 12, 20, 25, 30, 40, 75]), r.choice([40, 60, 80, 120, 250, 360, 480])
    return r.choice(
        [
            f"Calculate {p} percent of {n}.",
            f"A jacket costs ${n}. It is on sale for {p}% off. What is the sale price?",
            f"{r.choice(NAMES)} scored {p * n // 100} out of {n} points. What percentage is that?",
        ]
    )


def _multiples(r: random.Random) -> str:
    a, b = r.sample([3, 4, 5, 6, 8, 9, 10, 12, 14, 15, 18, 20], 2)
    return r.choice(
        [
            f"Find the greatest common divisor of {a * 2} and {b * 2}.",
            f"Find the smallest number that both {a} and {b} divide evenly.",
            f"List the first five multiples of {a}.",
        ]
    )


def _rounding(r: random.Random) -> str:
    n = r.randint(1000, 99999)
    place = r.choice(["ten", "thousand", "ten thousand"])
    x = r.randint(10, 999) / 100
    return r.choice([f"Round {n:,} to the nearest {place}.", f"Round {x} to one decimal place."])


def _fractions(r: random.Random) -> str:
    a, b = r.sample([(1, 2), (1, 3), (2, 5), (3, 8), (5, 6), (4, 7), (3, 10), (7, 9)], 2)
    return r.choice(
        [
            f"Add {a[0]}/{a[1]} and {b[0]}/{b[1]}. Show the steps.",
            f"Convert {a[0]}/{a[1]} to a decimal.",
            f"Put these fractions in order from smallest to largest: {a[0]}/{a[1]}, "
            f"{b[0]}/{b[1]}, 1/4.",
        ]
    )


def _clock(r: random.Random) -> str:
    h, m = r.randint(6, 11), r.choice([5, 15, 20, 35, 45, 50])
    d_h, d_m = r.randint(1, 4), r.choice([10, 25, 40, 55])
    return r.choice(
        [
            f"A movie starts at {h}:{m:02d} pm and lasts {d_h} hours and {d_m} minutes. "
            "When does it end?",
            f"{r.choice(NAMES)} left home at {h}:{m:02d} am and arrived at "
            f"{h + d_h}:{d_m:02d} am. How long was the trip?",
        ]
    )


def _rates(r: random.Random) -> str:
    n, k = r.choice([3, 4, 5, 6, 8]), r.choice([2, 3, 4, 5])
    price = r.choice([1.5, 2.25, 3, 4.5, 6])
    return r.choice(
        [
            f"If {n} notebooks cost ${n * price:.2f}, how much do {n + k} notebooks cost?",
            f"A printer prints {n * 10} pages in {k} minutes. How many pages does it print in "
            f"{k * 3} minutes?",
            f"A recipe for {n} people needs {k * 100} grams of flour. How much flour is needed "
            f"for {n * 2} people?",
        ]
    )


def _measures(r: random.Random) -> str:
    w, h = r.randint(3, 15), r.randint(2, 12)
    return r.choice(
        [
            f"A rectangle is {w} cm long and {h} cm wide. What are its area and perimeter?",
            f"Convert {w * 250} meters to kilometers.",
            f"How many minutes are there in {h} hours and {w} minutes?",
            f"The average of three numbers is {w + h}. Two of them are {w} and {h}. "
            "What is the third?",
        ]
    )


def _equations(r: random.Random) -> str:
    a, x, b = r.randint(2, 9), r.randint(2, 12), r.randint(1, 20)
    return r.choice(
        [
            f"Solve for x: {a}x + {b} = {a * x + b}.",
            f"Evaluate {a} + {x} x {b} - {a}, using the order of operations.",
            f"I think of a number, multiply it by {a} and subtract {b}. The result is "
            f"{a * x - b}. What was my number?",
        ]
    )


_PROBLEMS = [_percent, _multiples, _rounding, _fractions, _clock, _rates, _measures, _equations]

# Short factual questions: a form and the things it fits.
FACT_FORMS = {
    "What is a {x} used for?": _items(
        """
        microscope; thermostat; compass; barometer; spirit level; stapler; whisk; funnel;
        magnifying glass; pressure cooker; rolling pin; metronome; seismograph; sundial; ladle;
        tape measure; hourglass; otoscope; anemometer; colander
        """
    ),
    "Who invented the {x}?": _items(
        """
        telephone; light bulb; printing press; airplane; radio; telescope; steam engine;
        television; bicycle; World Wide Web; vaccine for smallpox; periodic table
        """
    ),
    "What is the largest {x} in the world?": _items(
        """
        ocean; desert; rainforest; island; lake; country by area; animal; bird; flower; city by
        population; coral reef; waterfall
        """
    ),
    "How is {x} made?": _items(
        """
        cheese; paper; glass; chocolate; yogurt; steel; bread; honey; salt; wool yarn; maple
        syrup; olive oil; butter; pencils; soap
        """
    ),
    "What happens to {x}?": _items(
        """
        water when it freezes; a caterpillar inside a cocoon; the body when we sleep; plastic in
        the ocean; food in the stomach; rain after it falls; the sun at the end of its life;
        leaves that fall in autumn; an apple left out for a week
        """
    ),
    "Why do {x}?": _items(
        """
        cats sleep so much; people get goosebumps; giraffes have long necks; some animals
        hibernate; we need to drink water; planes leave white trails; boats float; our ears pop on
        a plane; leaves have veins; camels have humps
        """
    ),
}

# Story lines a story must begin or end with.
OPENINGS = _items(
    """
Nobody in the village had ever seen snow in July; The letter had no stamp and no return address;
On the morning of her tenth birthday, Lena found a key under her pillow; The robot had one job,
and it had just failed at it; Every night at midnight, the old radio turned itself on; The new
boy in class never took off his yellow raincoat; It was the quietest zoo in the world until the
parrot learned to sing; The bakery on Elm Street only opened when it rained; Grandpa said the
map was a joke, but the X was real; The last train of the night stopped at a station that was
not on any map; When the power went out, the whole street came outside; My shadow started
moving before I did
"""
)
ENDINGS = _items(
    """
And from that day on, the river was never lonely again; That was the last time anyone doubted
the little goat; She smiled, closed the book, and turned off the light; It was the best mistake
he ever made; And the bell has rung every evening since; Sometimes the smallest voice is the
one that saves the day; They never found the treasure, but they found each other; The garden
was finally ready for spring; He kept the pebble in his pocket for the rest of his life; And the
moon, for once, was not alone
"""
)
STORY_LINE_FORMS = [
    "Write a short story that begins with: '{o}.'",
    "Start a story with the sentence '{o}.' and keep it under 200 words.",
    "Write a story for children that ends with: '{e}.'",
    "Write a short story whose last line is '{e}.'",
]
STORY_SUBJECTS = _items(
    """
a kettle that whistles a different tune every morning; a snowflake that does not want to melt;
a lost umbrella looking for its owner; a library book that was never borrowed; a scarecrow who
befriends the crows; a lighthouse that is afraid of the dark; a paper plane that flies around the
world; a family of hedgehogs preparing for winter; a cloud that wants to become rain; two
rival ice cream trucks; a sock that escapes from the washing machine; a piano that plays by
itself at night; a tiny seed in a crack in the pavement; a grandmother and her first video call
"""
)
STORY_SUBJECT_FORMS = [
    "Tell a story about {s}.",
    "Write a short story about {s}.",
    "Write a story about {s}, with a happy ending.",
]

# Coding questions: concepts, comparisons, and small tasks in SQL, shell and HTML/CSS.
CONCEPTS = _items(
    """
a variable; a function; a class; an API; a database index; version control; a linked list; a
hash table; a stack; a queue; an exception; a unit test; a compiler warning; an infinite loop;
object-oriented programming; a callback; an environment variable; JSON; a regular expression;
binary search; a pointer; garbage collection; a race condition; caching; recursion depth; an
off-by-one error
"""
)
CONCEPT_FORMS = [
    "What is {x} in programming? Explain with a short example.",
    "Explain {x} to someone who is new to coding.",
    "Why is {x} useful? Give an example in Python.",
]
PAIRS = _items(
    """
a list and a tuple in Python; a while loop and a for loop; == and is in Python; a process and a
thread; HTTP and HTTPS; a stack and a queue; Git merge and Git rebase; SQL and NoSQL databases;
a function and a method; static and dynamic typing; let and const in JavaScript; an array and a
linked list; GET and POST requests; a library and a framework; RAM and storage; a class and an
object
"""
)
PAIR_FORMS = ["What is the difference between {x}?", "Compare {x}, with a short example of each."]
SQL_TASKS = _items(
    """
finds all customers who live in Paris; counts how many orders each customer has placed;
returns the five most expensive products; lists employees hired after 2020; finds the average
salary in each department; deletes all rows where the status is 'cancelled'; adds a new column
called email to the users table; joins the orders table with the customers table; finds
products that have never been ordered; updates the price of one product
"""
)
SHELL_TASKS = _items(
    """
count the lines in a file; find all .txt files in a folder and its subfolders; show the disk
space used by each folder; rename every .jpeg file to .jpg; search for a word in all files of a
folder; show the last 20 lines of a log file; make a compressed archive of a folder; print the
current date and time; see which process uses the most memory; create ten empty files at once
"""
)
WEB_TASKS = _items(
    """
a button that changes color when you hover over it; a page with a centered title and a short
paragraph; a simple contact form with name, email and message fields; a table of three fruits
and their prices; an unordered list of five favorite books; a navigation bar with three links;
an image with a caption below it; a page with a dark background and white text
"""
)
TASK_FORMS = [
    "Write an SQL query that {t}.",
    "Write a shell command to {t}.",
    "Write the HTML and CSS for {t}.",
]
