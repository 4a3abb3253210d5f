"""The demo's default task: copy one number out of a list, by a rule.

Each prompt holds a list of distinct 3-digit numbers; the answer is one of them, chosen by
the skill's rule. Answers are three digit tokens (the tiny models' tokenizer splits
digits), spread over 900 values, so no constant answer scores: the most common answer of
a skill is a few percent of its prompts at most (a test holds it under 3%). The level
(1..3) is the list's length, 3, 4 or 5. Skills::

    max     the largest number                        Largest of 412 887 305?
    min     the smallest number                       Smallest of 412 887 305?
    after   the number right after X                  After 887 in 412 887 305?
    before  the number right before X                 Before 305 in 412 887 305?
    above   the first number greater than Y           First above 500 in 412 887 305?
    nth     the k-th number                           Second of 412 887 305?

Splits (``make_splits``): ``pool`` spreads evenly over every skill and level;
``val_<skill>`` and ``test_<skill>`` hold one skill each (every skill has them, so the
targets could be chosen after the warm start and full-pool runs); ``warmstart`` is the
supervised set of the initial model. The targets and the warm start's stopping snapshot
were fixed by the design criteria in docs/demo.md, from the warm start and full-pool
training alone, before CROPI was run on the task.
"""

from __future__ import annotations

import random
from typing import Callable, Mapping

from cropi.data.records import PromptRecord
from cropi.errors import InvalidInputError
from cropi.tasks.base import POOL, WARMSTART, Task
from cropi.tasks.sampling import draw_split, question_record

SKILLS = ("max", "min", "after", "before", "above", "nth")
LEVELS = (1, 2, 3)
SOURCE_PREFIX = "lists/"
# Chosen from the warm start and full-pool training (docs/demo.md, benchmarks/results/demo/task_probe.json).
TARGETS = {"max": ("val_max", "test_max"), "nth": ("val_nth", "test_nth")}
TRIES = 2000  # draws per problem before a cell counts as exhausted
_ORDINALS = ("First", "Second", "Third", "Fourth", "Fifth")


def _numbers(rng: random.Random, level: int) -> list[int]:
    return rng.sample(range(100, 1000), level + 2)


def _show(values: list[int]) -> str:
    return " ".join(map(str, values))


def _max(rng, level):
    v = _numbers(rng, level)
    return f"Largest of {_show(v)}?", max(v)


def _min(rng, level):
    v = _numbers(rng, level)
    return f"Smallest of {_show(v)}?", min(v)


def _after(rng, level):
    v = _numbers(rng, level)
    i = rng.randrange(len(v) - 1)
    return f"After {v[i]} in {_show(v)}?", v[i + 1]


def _before(rng, level):
    v = _numbers(rng, level)
    i = rng.randrange(1, len(v))
    return f"Before {v[i]} in {_show(v)}?", v[i - 1]


def _above(rng, level):
    v = _numbers(rng, level)
    bound = rng.randint(100, max(v) - 1)  # some number lies above it
    return f"First above {bound} in {_show(v)}?", next(x for x in v if x > bound)


def _nth(rng, level):
    v = _numbers(rng, level)
    k = rng.randrange(len(v))
    return f"{_ORDINALS[k]} of {_show(v)}?", v[k]


GENERATORS: dict[str, Callable[[random.Random, int], tuple[str, int]]] = {
    "max": _max, "min": _min, "after": _after, "before": _before, "above": _above, "nth": _nth}


def make_record(skill: str, level: int, question: str, answer: int) -> PromptRecord:
    """The prompt record of one problem: a chat prompt, the answer, skill and level."""
    return question_record(SOURCE_PREFIX, skill, level, question, answer)


def split_names() -> list[str]:
    return [POOL, *(f"{kind}_{s}" for kind in ("test", "val") for s in SKILLS), WARMSTART]


def mixture(split: str) -> dict[str, float]:
    """Skill weights of a split; levels are always even."""
    if split in (POOL, WARMSTART):
        return {s: 1 / len(SKILLS) for s in SKILLS}
    kind, _, skill = split.partition("_")
    if kind in ("val", "test") and skill in SKILLS:
        return {skill: 1.0}
    raise InvalidInputError(f"unknown split {split!r}; expected one of {', '.join(split_names())}")


def make_splits(seed: int, sizes: Mapping[str, int]) -> dict[str, list[PromptRecord]]:
    """Every split named in ``sizes``, no problem in two splits; deterministic in ``seed``.

    Tests first, then validation, then the pool, then the warm-start set, each from its own
    seeded stream, so a held-out split never changes with the pool's size.
    """
    for name, n in sizes.items():
        mixture(name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInputError(f"{name} size must be a positive integer, got {n!r}")
    seen: set[str] = set()
    drawn = {name: _draw(name, sizes[name], seed, seen) for name in split_names() if name in sizes}
    return {name: drawn[name] for name in sizes}


def _draw(split: str, n: int, seed: int, seen: set[str]) -> list[PromptRecord]:
    return draw_split(random.Random(f"cropi.lists:{seed}:{split}"), mixture(split), LEVELS, n, seen, problem, TRIES)


def problem(rng: random.Random, skill: str, level: int) -> tuple[str, PromptRecord]:
    question, answer = GENERATORS[skill](rng, level)
    return question, make_record(skill, level, question, answer)


def answer_position(record: PromptRecord) -> str:
    """Where the answer sits in the prompt's list: ``first``, ``last`` or ``middle``.

    The shortcut CROPI's stage-0 selection took on this task: 94% of its picks had the list's
    last number as answer (34% of the mixed-reward pool), and training on them taught the model
    to answer the last number (docs/demo.md)."""
    text = record.prompt if isinstance(record.prompt, str) else record.prompt[-1]["content"]
    head, _, tail = text.rstrip("?").rpartition(" in " if " in " in text else " of ")
    values = tail.split()
    i = values.index(str(record.answer))
    return "first" if i == 0 else "last" if i == len(values) - 1 else "middle"


SIZES = {POOL: 1200, **{f"val_{s}": 100 for s in SKILLS}, **{f"test_{s}": 200 for s in SKILLS}, WARMSTART: 20000}

TASK = Task(
    name="lists", make_splits=make_splits, targets=TARGETS, sizes=SIZES, max_new_tokens=5,
    # stop_at: the first snapshot meeting the design criteria (docs/demo.md;
    # benchmarks/results/demo/warmstart_scan.json from python -m cropi.demo.build_assets --task lists --scan)
    warm_start=dict(size="tiny", steps=3000, batch_size=64, lr=1e-3, seed=0, stop_at=500),
    description="copy one 3-digit number out of a list by a rule (six skills, lists of 3-5)",
    fields={"answer_position": answer_position})
