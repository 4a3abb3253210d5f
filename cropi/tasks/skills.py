"""The demo's verifiable task: six skills with one-digit answers, three levels each.

Built for what a small model learns by RL on a CPU: every answer is one digit, so a
response is two tokens (the digit and the end of turn) and generation is cheap, and
every skill is a rule a tiny transformer learns partially from a short supervised
run, which GRPO then sharpens. Each (skill, level) cell holds hundreds of distinct
problems, so the splits never share one. Skills and what the level (1..3) controls::

    count    how many times a digit occurs in a 4-, 6-, 8-digit number        (target)
    maxd     the largest digit of a 4-, 6-, 8-digit number                     (target)
    mind     the smallest digit of a 4-, 6-, 8-digit number
    pos      the k-th digit of a 4-, 6-, 8-digit number
    mod      x mod d:  2-digit x, d in 2..5;  2-digit x, d in 6..9;  3-digit x, d in 2..9
    lastmul  the last digit of x * d, with the same x and d as mod

Splits (``make_splits``): ``pool`` spreads evenly over every skill and level; the
targeted validation sets are ``val_count`` and ``val_maxd`` (one skill each);
``test_count`` and ``test_maxd`` are their held-out test splits; ``warmstart`` is
the supervised set the shipped initial model learned from. The other four skills
are in the pool only: training on them should help the targets less, which a good
influence ranking has to find out. The targets are the skills whose warm-started
greedy accuracy lies far above their sampled accuracy, the headroom GRPO sharpens;
this and the other design criteria were fixed from the initial model and full-pool
training before CROPI was run on the task (docs/demo.md).
"""

from __future__ import annotations

import random
from typing import Callable

from cropi.data.records import PromptRecord
from cropi.errors import InvalidInputError
from cropi.tasks.base import Task
from cropi.tasks.sampling import TaskSizeError, draw_split, question_record  # noqa: F401 (TaskSizeError re-exported)

SKILLS = ("count", "maxd", "mind", "pos", "mod", "lastmul")
LEVELS = (1, 2, 3)
TARGETS = {"count": ("val_count", "test_count"), "maxd": ("val_maxd", "test_maxd")}
SOURCE_PREFIX = "skills/"  # data_source of a record: skills/<skill>
TRIES = 2000  # draws per problem before a cell counts as exhausted
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _n(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _operands(rng: random.Random, level: int) -> tuple[int, int]:
    return _n(rng, 3 if level == 3 else 2), rng.randint(*[(2, 5), (6, 9), (2, 9)][level - 1])


def _digits(rng: random.Random, level: int) -> str:
    return str(_n(rng, 2 + 2 * level))


def _mod(rng, level):
    x, d = _operands(rng, level)
    return f"What is {x} mod {d}?", x % d


def _lastmul(rng, level):
    x, d = _operands(rng, level)
    return f"Last digit of {x} * {d}?", (x * d) % 10


def _count(rng, level):
    s = _digits(rng, level)
    digit = rng.choice(s) if rng.random() < 0.8 else str(rng.randint(0, 9))
    return f"How many {digit}s in {s}?", s.count(digit)


def _pos(rng, level):
    s = _digits(rng, level)
    k = rng.randrange(len(s))
    return f"The {_ORDINALS[k]} digit of {s}?", int(s[k])


def _maxd(rng, level):
    s = _digits(rng, level)
    return f"Largest digit of {s}?", max(int(c) for c in s)


def _mind(rng, level):
    s = _digits(rng, level)
    return f"Smallest digit of {s}?", min(int(c) for c in s)


GENERATORS: dict[str, Callable[[random.Random, int], tuple[str, int]]] = {
    "mod": _mod, "lastmul": _lastmul, "count": _count, "pos": _pos, "maxd": _maxd, "mind": _mind}


def make_record(skill: str, level: int, question: str, answer: int) -> PromptRecord:
    """The prompt record of one problem: a chat prompt, the integer answer, skill and level."""
    return question_record(SOURCE_PREFIX, skill, level, question, answer)


def response_text(record: PromptRecord) -> str:
    """The response the task expects: the answer alone (the model then ends its turn)."""
    return record.answer


def mixture(split: str) -> dict[str, float]:
    """Skill weights of a split; levels are always even."""
    if split in ("pool", "warmstart"):
        return {s: 1 / len(SKILLS) for s in SKILLS}
    for skill, names in TARGETS.items():
        if split in names:
            return {skill: 1.0}
    raise InvalidInputError(f"unknown split {split!r}; expected one of {', '.join(split_names())}")


def split_names() -> list[str]:
    return ["pool", *(n for names in TARGETS.values() for n in names), "warmstart"]


def target_skills() -> list[str]:
    return list(TARGETS)


def make_splits(seed: int, sizes: dict[str, int]) -> dict[str, list[PromptRecord]]:
    """Every split named in ``sizes`` (see ``split_names``), no problem in two splits.

    Deterministic in ``seed``. Held-out splits are drawn first (tests, then
    validation, then the pool, then the warm-start set), each from its own seeded
    stream, so a test split never changes with the pool's size.
    """
    for name, n in sizes.items():
        mixture(name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInputError(f"{name} size must be a positive integer, got {n!r}")
    order = [n for n in split_names() if n.startswith("test")] + \
            [n for n in split_names() if n.startswith("val")] + ["pool", "warmstart"]
    seen: set[str] = set()
    drawn = {name: _draw(name, sizes[name], seed, seen) for name in order if name in sizes}
    return {name: drawn[name] for name in sizes}


def _draw(split: str, n: int, seed: int, seen: set[str]) -> list[PromptRecord]:
    rng = random.Random(f"cropi.skills:{seed}:{split}")
    return draw_split(rng, mixture(split), LEVELS, n, seen, problem, TRIES)


def problem(rng: random.Random, skill: str, level: int) -> tuple[str, PromptRecord]:
    question, answer = GENERATORS[skill](rng, level)
    return question, make_record(skill, level, question, answer)


# Every demo split is a prefix of these; the warm-start set is drawn after them.
SIZES = {"test_count": 200, "test_maxd": 200, "val_count": 100, "val_maxd": 100, "pool": 1200, "warmstart": 3000}

TASK = Task(
    name="skills", make_splits=make_splits, targets=TARGETS, sizes=SIZES, max_new_tokens=4,
    response_text=response_text,
    # stop_at: the first snapshot whose targets' sampled accuracy reached the design range (docs/demo.md)
    warm_start=dict(size="tiny", steps=4000, batch_size=64, lr=3e-3, seed=0, stop_at=100),
    description="six skills with one-digit answers (the label-skew regime: see docs/demo.md)")
