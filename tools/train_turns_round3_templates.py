"""Wording for round 3 of `train-turns` (train_turns_round3.py): everyday single-turn requests of
the chat, instructions, stories and code kinds, as slot lists (items split at ";") and the forms
they fill."""


def _items(text: str) -> list[str]:
    return [" ".join(x.split()) for x in text.split(";") if x.strip()]


ACTIVITIES = _items(
    """
make a cup of tea; plant tomato seeds; change a flat bicycle tire; clean a laptop keyboard; make
pancakes from scratch; fold a fitted sheet; write a thank-you note; start a vegetable garden on
a balcony; make a paper boat; tie a bowline knot; brew coffee with a French press; make a fruit
smoothie; wash a wool sweater by hand; back up the photos on a phone; set up a fish tank;
prepare for a job interview; make a study schedule for exams; train a puppy to sit; bake a loaf
of bread; cook rice on the stove; remove a coffee stain from a shirt; hang a picture frame
straight; pack a suitcase for a week-long trip; build a birdhouse; make a healthy packed lunch;
grow herbs on a windowsill; clean a cast iron pan; start a compost bin; care for a houseplant;
jump-start a car; make lemonade; organize a messy closet; practice deep breathing to relax; make
a fruit salad; sharpen a kitchen knife; make a paper snowflake; start running as a beginner;
make a simple kite; do a push-up correctly; keep cut flowers fresh longer; make scrambled eggs;
save money on groceries; learn new words in a foreign language; clean windows without streaks;
prepare a room for painting; make hot chocolate; wrap a present neatly; stay focused while
working from home; bake chocolate chip cookies; take care of a mild sunburn; make guacamole;
check the oil level in a car; memorize a short poem; plan a birthday party for a child; start
keeping a journal; make a simple tomato sauce; clean a microwave; make a terrarium; fix a
squeaky door; teach a child to ride a bike; make popcorn on the stove; set a table for a dinner
party; fold a paper crane; introduce a new cat to a home; prepare for a long hike; write a cover
letter; brush a dog's teeth; make vegetable soup; reduce food waste at home; draw a simple
cartoon face; defrost a freezer; water a lawn without wasting water; peel and cut a mango; make
overnight oats; plan a picnic; make a bird feeder from a pine cone; sew on a button; iron a
dress shirt; make a cheese omelette; brew green tea properly; clean a bathroom quickly; write a
to-do list that works; make iced coffee at home; repot a plant; choose a ripe avocado; make a
simple salad dressing
"""
)

HOWTO_FORMS = [
    "Explain how to {a}.",
    "How do I {a}?",
    "What are the steps to {a}?",
    "Give me step-by-step instructions to {a}.",
    "Describe how to {a} in five steps.",
    "I want to {a}. Where do I start?",
    "What is the easiest way to {a}?",
    "Write a short guide on how to {a}.",
]

LIST_THINGS = _items(
    """
indoor activities for a rainy day; healthy snacks for children; ways to save energy at home;
tips for sleeping better; things to pack for a day at the beach; ways to reduce stress; easy
dinners for busy weeknights; houseplants that are hard to kill; questions to ask at the end of a
job interview; ways to have a more productive morning; birthday gift ideas for a grandmother;
ways to stay cool in summer; tips for someone learning to cook; habits of good students; ways to
make friends in a new city; breakfast ideas without eggs; things to do before a long road trip;
ways to reuse glass jars; tips for speaking in public; hobbies that cost very little; board
games for families; ways to help the environment; safety tips for cycling in a city; questions
to get to know someone; foods that are high in protein; tips for keeping a kitchen clean; winter
activities for children; things to do on a lazy Sunday; tips for a first-time gardener; ways to
cut down on screen time; team-building activities for an office; ways to stay motivated to
exercise; snacks for a movie night; tips for writing a clear email; ideas for a science fair
project; ways to make a small room feel bigger; desserts that need no oven; tips for traveling
on a budget; things every first-aid kit should have; ways to welcome a new neighbor; fruits that
are rich in vitamin C; ways to practice gratitude; tips for taking better phone photos; things
to check before buying a used car; ways to keep a dog busy indoors; easy crafts for toddlers;
tips for remembering names; ways to decorate a home for autumn; animals that live in the desert;
musical instruments for beginners; ways to use leftover rice; tips for drinking more water;
quiet hobbies; picnic foods that travel well; things to do at the beach besides swimming; ways
to keep a conversation going; tips for a good night before an exam; ways to be kind to a
coworker; classic novels for teenagers; simple stretches to do at a desk; ways to make a commute
more pleasant; foods that freeze well
"""
)

LIST_FORMS = [
    "Give me a list of {n} {x}.",
    "List {n} {x}.",
    "Name {n} {x}, with one sentence on each.",
    "Suggest {n} {x}.",
    "Make a numbered list of {n} {x}.",
    "What are {n} {x}? Keep each one short.",
]

GROUPS = {
    "mammals": _items(
        """
        dog; whale; bat; elephant; dolphin; horse; tiger; rabbit; cow; kangaroo;
        giraffe; bear; mouse; camel
"""
    ),
    "birds": _items(
        """
        eagle; penguin; ostrich; parrot; owl; sparrow; flamingo; crow; hummingbird;
        swan; pigeon; peacock
"""
    ),
    "reptiles": _items(
        """
        snake; lizard; crocodile; turtle; iguana; gecko; chameleon
"""
    ),
    "fish": _items(
        """
        salmon; shark; tuna; goldfish; trout; cod; clownfish
"""
    ),
    "insects": _items(
        """
        ant; bee; butterfly; beetle; grasshopper; mosquito; ladybug
"""
    ),
}

FOODS = {
    "fruits": _items(
        """
        apple; banana; mango; cherry; grape; pear; kiwi; peach; plum; orange; pineapple;
        strawberry
"""
    ),
    "vegetables": _items(
        """
        carrot; broccoli; spinach; potato; onion; cabbage; lettuce; celery; cucumber;
        zucchini; cauliflower
"""
    ),
}

COUNTRIES = _items(
    """
France; Japan; Brazil; Kenya; Canada; Egypt; India; Australia; Mexico; Norway; Argentina;
Thailand; Italy; Peru; Spain; Vietnam; Ghana; Germany; Chile; Turkey
"""
)

SET_FORMS = [
    "Classify these animals as {a} or {b}: {items}.",
    "Which of these animals are {a} and which are {b}? {items}",
    "Tell me one interesting fact about each of these animals: {items}.",
    "Sort these foods into fruits and vegetables: {foods}.",
    "Which continent is each of these countries in? {countries}",
    "What is the capital city of each of these countries: {countries}?",
    "Give me one traditional dish from each of these countries: {countries}.",
]

SCENES = _items(
    """
a busy market in the morning; a beach at sunset; a quiet library; a mountain lake in summer; a
city street after rain; an old farmhouse kitchen; a garden in spring; a train station at night;
a desert at noon; a snowy village; a lighthouse in a storm; a farm at dawn; an empty classroom;
a rainforest after a storm; a coffee shop on a Sunday; a fishing harbor; a field of sunflowers;
a castle on a hill; a playground after school; a night sky in the countryside; a bakery early in
the morning; an autumn park; a crowded subway car; a small island; a thunderstorm over the sea;
a cozy cabin
"""
)

SCENE_FORMS = [
    "Write a short description of {s}.",
    "Describe {s} in a few sentences.",
    "Write a paragraph describing {s}, using all five senses.",
    "Write a short poem about {s}.",
    "Write a haiku about {s}.",
]

CHARACTERS = _items(
    """
a shy dragon; a retired firefighter; a girl who can talk to birds; a lonely lighthouse keeper; a
robot chef; a lost kitten; an old fisherman; a young inventor; a talking tree; a nervous new
teacher; a brave little turtle; a mail carrier in the mountains; a forgetful wizard; a street
musician; a boy who collects rocks; a cat who wants to fly; a snowman; a pirate who is afraid of
water; a grandmother who loves skateboarding; a tiny ant; a clumsy knight; a bus driver; a
curious owl; a baker in a small village
"""
)

SITUATIONS = _items(
    """
finds a map inside an old book; has to win a race; gets lost in a big city; makes an unexpected
friend; discovers a secret door; must cross a wide river; wakes up with a new talent; tries to
cook dinner for the first time; loses something very important; has one day to save the town
fair; meets a stranger on a train; builds something out of scraps; receives a letter from the
future; gets stuck in a snowstorm; learns to say sorry; wants to see the ocean; finds a
mysterious egg; enters a talent show
"""
)

STORY_FORMS = [
    "Write a short story about {c} who {s}.",
    "Tell a story about {c} who {s}.",
    "Write a bedtime story about {c} who {s}.",
    "Write a funny story about {c} who {s}.",
    "Write a story of about 200 words about {c} who {s}.",
]

ANIMALS = _items(
    """
koalas; owls; sharks; bees; penguins; camels; frogs; octopuses; giraffes; bats; hedgehogs;
turtles; wolves; parrots; otters; ants; spiders; horses; rabbits; squirrels; flamingos;
crocodiles; goats; whales; foxes; seahorses; butterflies; polar bears; lions; snails; chickens;
deer; beavers; zebras
"""
)

ANIMAL_FORMS = [
    "Where do {x} live?",
    "How long do {x} usually live?",
    "How do {x} take care of their young?",
    "Are {x} dangerous to people?",
    "What are {x} good at?",
    "How do {x} survive the winter?",
]

OBJECTS = _items(
    """
a refrigerator; a microwave oven; a compass; a thermometer; an elevator; a solar panel; a smoke
detector; a vacuum cleaner; a battery; a light bulb; a telescope; a washing machine; a zipper; a
camera; a toaster; a hot air balloon; a submarine; a windmill; a piano; a traffic light; a
parachute; a bicycle; a touch screen; a lock and key; an electric kettle; a heat pump
"""
)

OBJECT_FORMS = [
    "How does {x} work?",
    "Can you explain how {x} works in simple terms?",
    "What are the main parts of {x}?",
]

WHY_QUESTIONS = _items(
    """
Why do leaves change color in autumn?; Why do we yawn?; Why is the ocean salty?; Why do cats
purr?; Why does ice float?; Why do we have seasons?; Why do onions make you cry?; Why does bread
go stale?; Why do stars twinkle?; Why do birds migrate?; Why does thunder come after lightning?;
Why do we dream?; Why do we get hiccups?; Why does metal feel colder than wood?; Why do dogs wag
their tails?; Why do we need sleep?; Why does popcorn pop?; Why do cut apples turn brown?; Why
do volcanoes erupt?; Why does the wind blow?; Why do zebras have stripes?; Why do fingers
wrinkle in water?; Why is the sun so hot?; Why do bees make honey?; Why do rainbows appear after
rain?; Why do tides happen?; Why is snow white?; Why do we sneeze?; Why does the sky turn red at
sunset?; Why do some trees lose their leaves?
"""
)

WIKI_CHAT_FORMS = [
    "Can you tell me a bit about {t}?",
    "Give me a quick overview of {t}.",
    "I'm curious about {t}. What is it?",
    "What are the most important things to know about {t}?",
]

SNIPPET_FORMS = [
    "Explain what this Python function does:\n\n```python\n{src}```",
    "```python\n{src}```\n\nWalk me through this function line by line.",
    "Write two unit tests for this Python function:\n\n```python\n{src}```",
    "```python\n{src}```\n\nWhat are the edge cases this function handles?",
    "Rewrite this Python function so that it is easier to read:\n\n```python\n{src}```",
]

SNIPPET_MODULES = _items(
    """
textwrap; string; shlex; fnmatch; posixpath; calendar; statistics; heapq; bisect; colorsys;
difflib; html; ipaddress; base64; glob; random; fractions; urllib.parse; json.decoder;
email.utils; csv; tokenize; copy; operator; functools; collections; pprint; gettext; mimetypes;
quopri
"""
)

NEW_CODE_TASKS = _items(
    """
reads a text file and prints how many lines it has; sorts a list of people by age; returns the
most common word in a text; checks whether a number is prime; converts a number of seconds to
hours, minutes and seconds; reverses the order of words in a sentence; counts the vowels in a
string; returns the factorial of a number; finds all numbers divisible by 3 and 5 up to 100;
turns a list of words into one comma-separated string; computes the area of a circle from its
radius; returns the common elements of two lists; generates a random password of a given length;
checks whether a list is sorted; converts a string to title case; finds the longest word in a
sentence; groups a list of words by their first letter; returns a list of the squares of the
numbers 1 to 10; checks whether brackets in a string are balanced; converts a binary string to a
decimal number
"""
)

NEW_CODE_FORMS = [
    "Write a {lang} function that {task}.",
    "In {lang}, how would I write a function that {task}?",
    "Show me {lang} code that {task}, and explain it briefly.",
]

CODE_LANGS = ["Python", "JavaScript", "Java", "C#", "Go", "Rust", "Kotlin", "PHP", "Swift", "C++"]
