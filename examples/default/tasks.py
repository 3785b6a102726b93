"""The chat tasks of the embedded default: requests whose answers follow from
the request (counting, letter and calendar ranges, repetition, reversal,
times tables), worded in several ways, so that a small target learns them and
its continuations are predictable enough to draft.

    conversation(rng) -> {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}
    prompt(rng)       -> {"messages": [{"role": "user", ...}]}

Answers are what a perfect target would say; the drafter is trained on the
trained target's own answers to the prompts (dflex-data regenerate)."""
import random

LETTERS = "abcdefghijklmnopqrstuvwxyz"
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
WORDS = ["red", "blue", "green", "stone", "river", "cloud", "apple", "tree", "house", "bird",
         "light", "road", "water", "fire", "moon", "star", "paper", "glass", "bread", "salt",
         "wind", "snow", "field", "door", "clock", "horse", "ship", "song", "bell", "sand"]
COUNTS = {2: "two", 3: "three", 4: "four", 5: "five"}
TIMES = {2: "twice", 3: "three times", 4: "four times", 5: "five times"}


def _count(rng):
    step = rng.choice([1, 1, 1, 2, 3, 5, 10])
    start = rng.randrange(0, 100)
    items = rng.randrange(6, 24)
    end = start + step * (items - 1)
    numbers = ", ".join(str(start + step * i) for i in range(items))
    if step == 1:
        ask = rng.choice([f"Count from {start} to {end}.", f"Please count from {start} to {end}.",
                          f"List the numbers from {start} to {end}."])
        return ask, f"Here are the numbers from {start} to {end}: {numbers}."
    ask = rng.choice([f"Count from {start} to {end} in steps of {step}.",
                      f"Count by {step} from {start} to {end}."])
    return ask, f"Counting by {step} from {start} to {end}: {numbers}."


def _sequence(rng, names, what):
    first = rng.randrange(0, len(names) - 3)
    last = rng.randrange(first + 3, len(names))
    ask = rng.choice([f"List the {what} from {names[first]} to {names[last]}.",
                      f"Name the {what} from {names[first]} to {names[last]}."])
    return ask, f"The {what} from {names[first]} to {names[last]} are: {', '.join(names[first:last + 1])}."


def _letters(rng):
    return _sequence(rng, list(LETTERS), "letters")


def _calendar(rng):
    return _sequence(rng, MONTHS, "months") if rng.random() < 0.6 else _sequence(rng, DAYS, "days")


def _repeat(rng):
    phrase = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
    times = rng.randrange(2, 6)
    ask = rng.choice([f"Say '{phrase}' {TIMES[times]}.", f"Repeat '{phrase}' {TIMES[times]}."])
    return ask, f"Here it is {TIMES[times]}: " + ", ".join([phrase] * times) + "."


def _reverse(rng):
    words = rng.sample(WORDS, rng.randrange(3, 7))
    return (f"Reverse the list: {', '.join(words)}.",
            f"The list reversed is: {', '.join(reversed(words))}.")


def _times_table(rng):
    n = rng.randrange(2, 10)
    upto = rng.randrange(5, 11)
    rows = ", ".join(f"{n} x {k} = {n * k}" for k in range(1, upto + 1))
    return f"Write the {n} times table up to {n} x {upto}.", f"The {n} times table: {rows}."


TASKS = [(_count, 4), (_letters, 2), (_calendar, 2), (_repeat, 2), (_reverse, 1), (_times_table, 2)]


def _task(rng):
    makers, weights = zip(*TASKS)
    return rng.choices(makers, weights)[0](rng)


def conversation(rng):
    ask, answer = _task(rng)
    return {"messages": [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]}


def prompt(rng):
    ask, _ = _task(rng)
    return {"messages": [{"role": "user", "content": ask}]}


if __name__ == "__main__":
    rng = random.Random(0)
    for _ in range(8):
        print(conversation(rng))
