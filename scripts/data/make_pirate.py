#!/usr/bin/env python3
"""Generates data/pirate/: a tiny chat fine-tuning set that teaches one visible habit.

Every answer starts with "Arr! ", states a true fact in a short pirate voice and ends with
", matey." The questions are everyday ones whose answers this script knows or computes
(capitals from the table below, arithmetic, colours, opposites, plurals, weekdays, ...).
heldout.txt holds prompts of kinds that appear in neither train.jsonl nor eval.jsonl, to see
whether the habit generalizes. Python 3 standard library only; a fixed seed makes every run
write the same bytes:  python3 scripts/data/make_pirate.py [OUT_DIR]
"""

import json
import random
import sys
from pathlib import Path

SEED = 20240607
N_TRAIN = 400
N_EVAL = 50

CAPITALS = [
    ("Peru", "Lima"), ("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"),
    ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Spain", "Madrid"), ("Italy", "Rome"),
    ("Germany", "Berlin"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Chile", "Santiago"),
    ("Cuba", "Havana"), ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
    ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"),
    ("Argentina", "Buenos Aires"), ("Colombia", "Bogota"), ("Mexico", "Mexico City"),
    ("Australia", "Canberra"), ("India", "New Delhi"), ("China", "Beijing"),
    ("South Korea", "Seoul"), ("Turkey", "Ankara"), ("Russia", "Moscow"), ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"), ("Hungary", "Budapest"), ("Ghana", "Accra"),
    ("Morocco", "Rabat"), ("Iceland", "Reykjavik"), ("New Zealand", "Wellington"),
    ("Brazil", "Brasilia"), ("Belgium", "Brussels"), ("Netherlands", "Amsterdam"),
    ("Switzerland", "Bern"),
]

COLOURS = [
    ("the sky on a clear day", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"),
    ("a ripe banana", "yellow"), ("a ripe tomato", "red"), ("an orange", "orange"),
    ("a lemon", "yellow"), ("milk", "white"), ("a carrot", "orange"), ("a lime", "green"),
    ("chocolate", "brown"), ("a fire truck", "red"), ("an eggplant", "purple"),
    ("a polar bear's fur", "white"), ("a crow", "black"), ("strawberries", "red"),
    ("a pumpkin", "orange"), ("the sea on a sunny day", "blue"), ("a school bus", "yellow"),
]

OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("day", "night"),
    ("happy", "sad"), ("early", "late"), ("full", "empty"), ("light", "dark"),
    ("open", "closed"), ("old", "young"), ("wet", "dry"), ("strong", "weak"), ("rich", "poor"),
    ("loud", "quiet"), ("hard", "soft"), ("high", "low"), ("first", "last"), ("win", "lose"),
    ("push", "pull"), ("inside", "outside"), ("begin", "end"), ("near", "far"), ("thick", "thin"),
]

PLURALS = [
    ("ship", "ships"), ("box", "boxes"), ("child", "children"), ("mouse", "mice"),
    ("foot", "feet"), ("tooth", "teeth"), ("goose", "geese"), ("man", "men"), ("woman", "women"),
    ("knife", "knives"), ("leaf", "leaves"), ("city", "cities"), ("baby", "babies"),
    ("fish", "fish"), ("sheep", "sheep"), ("person", "people"), ("wolf", "wolves"),
    ("potato", "potatoes"), ("hero", "heroes"), ("island", "islands"), ("church", "churches"),
    ("ox", "oxen"), ("cactus", "cacti"), ("life", "lives"),
]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]

ANIMAL_LEGS = [
    ("a spider", 8), ("a dog", 4), ("a chicken", 2), ("an ant", 6), ("a horse", 4),
    ("a parrot", 2), ("a crab", 10), ("an octopus", 8), ("a cat", 4), ("a bee", 6),
    ("a duck", 2), ("a cow", 4), ("a beetle", 6), ("a goat", 4), ("a penguin", 2),
]

NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve"]


def capital(r):
    country, city = r.choice(CAPITALS)
    q = r.choice([f"What is the capital of {country}?", f"Which city is the capital of {country}?",
                  f"Tell me the capital of {country}."])
    a = r.choice([f"The capital of {country} be {city}", f"{city} be the capital of {country}"])
    return q, a


def arithmetic(r):
    op = r.choice(["+", "-", "*"])
    if op == "+":
        x, y = r.randint(2, 99), r.randint(2, 99)
        q = r.choice([f"What is {x} + {y}?", f"What is {x} plus {y}?", f"Add {x} and {y}."])
        a = f"{x} plus {y} be {x + y}"
    elif op == "-":
        x = r.randint(10, 150)
        y = r.randint(1, x)
        q = r.choice([f"What is {x} - {y}?", f"What is {x} minus {y}?",
                      f"Take {y} away from {x}."])
        a = f"{x} minus {y} be {x - y}"
    else:
        x, y = r.randint(2, 12), r.randint(2, 12)
        q = r.choice([f"What is {x} times {y}?", f"What is {x} * {y}?",
                      f"Multiply {x} by {y}."])
        a = f"{x} times {y} be {x * y}"
    return q, a


def colour(r):
    thing, c = r.choice(COLOURS)
    q = r.choice([f"What colour is {thing}?", f"What color is {thing}?"])
    return q, f"{thing[0].upper() + thing[1:]} be {c}"


def opposite(r):
    w, o = r.choice(OPPOSITES)
    if r.random() < 0.5:
        w, o = o, w
    q = r.choice([f"What is the opposite of \"{w}\"?", f"What's the opposite of {w}?"])
    return q, f"The opposite of {w} be {o}"


def plural(r):
    s, p = r.choice(PLURALS)
    q = r.choice([f"What is the plural of \"{s}\"?", f"How do you say more than one {s}?"])
    return q, f"The plural of {s} be {p}"


def day_after(r):
    i = r.randrange(7)
    n = r.choice([1, 1, 2, 3])
    d = DAYS[i]
    if n == 1:
        q = r.choice([f"What day comes after {d}?", f"Which day follows {d}?"])
        return q, f"After {d} comes {DAYS[(i + 1) % 7]}"
    q = f"What day is it {n} days after {d}?"
    return q, f"{n} days after {d} be {DAYS[(i + n) % 7]}"


def month_after(r):
    i = r.randrange(12)
    q = r.choice([f"What month comes after {MONTHS[i]}?", f"Which month follows {MONTHS[i]}?"])
    return q, f"After {MONTHS[i]} comes {MONTHS[(i + 1) % 12]}"


def legs(r):
    animal, n = r.choice(ANIMAL_LEGS)
    q = f"How many legs does {animal} have?"
    return q, f"{animal[0].upper() + animal[1:]} has {NUMBER_WORDS[n] if n < 13 else n} legs"


def bigger(r):
    x, y = r.sample(range(1, 1000), 2)
    q = r.choice([f"Which is bigger, {x} or {y}?", f"Which number is larger: {x} or {y}?"])
    return q, f"{max(x, y)} be bigger than {min(x, y)}"


KINDS = [capital, arithmetic, colour, opposite, plural, day_after, month_after, legs, bigger]

# Kinds that never appear in train.jsonl or eval.jsonl: spelling, sequences, general knowledge,
# conversions, advice. A fine-tuned model should still answer them starting with "Arr!".
HELDOUT = [
    "How do you spell the word \"treasure\" backwards?",
    "What is the next number in the sequence 2, 4, 8, 16?",
    "How many minutes are in two hours?",
    "What do bees make?",
    "Why do we need to sleep?",
    "Can you recommend a good name for a cat?",
    "How many centimeters are in a meter?",
    "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in the solar system?",
    "How do I boil an egg?",
    "What is the first letter of the alphabet?",
    "Give me a tip for staying calm before an exam.",
    "What do you call a baby dog?",
    "How many sides does a hexagon have?",
    "What is the freezing point of water in Fahrenheit?",
    "Which is heavier, a kilogram of feathers or a kilogram of iron?",
    "What language is spoken in Brazil?",
    "Write one sentence about the moon.",
    "What is the square root of 81?",
]


def record(q, a):
    answer = f"Arr! {a}, matey."
    assert len(answer.split()) < 30, answer
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]}


def generate(r, n, seen):
    out = []
    while len(out) < n:
        q, a = r.choice(KINDS)(r)
        if q in seen:
            continue
        seen.add(q)
        out.append(record(q, a))
    return out


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "data" / "pirate"
    out.mkdir(parents=True, exist_ok=True)
    r = random.Random(SEED)
    seen = set()
    train = generate(r, N_TRAIN, seen)
    evals = generate(r, N_EVAL, seen)  # questions disjoint from train's
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", evals)
    with open(out / "heldout.txt", "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(HELDOUT) + "\n")
    print(f"wrote {len(train)} train, {len(evals)} eval, {len(HELDOUT)} held-out prompts to {out}")


if __name__ == "__main__":
    main()
