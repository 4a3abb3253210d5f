"""A task where the targets' skill is scarce in the pool: `lists`' problems and warm-started model, but
the two targeted skills make up a tenth of the pool.

The regime where a concentrated selection is the real skill (issue 32): the targets are `max` and `min`
(both in range for `lists`' shipped model, docs/demo.md), each 5% of the pool; the other four skills
share the rest evenly. The prompts that teach the targets are few, so training on the whole pool spends
nine steps in ten elsewhere, while a subset concentrated on them trains the skill itself: the answers
spread over 900 values and, for both skills, the answer's position in the list is uniform (no
positional shortcut, unlike the `last number` one `lists` offered CROPI's rule).

Splits: every `lists` split is drawn first (at its full sizes) and no problem here repeats one of
them; the warm-start set *is* `lists`' own, so `lists`' shipped model is this task's initial model
(``Task.model_of``) and no test or validation problem of this task was in its supervised set.
"""

from __future__ import annotations

import random
from typing import Mapping

from cropi.data.records import PromptRecord
from cropi.errors import InvalidInputError
from cropi.tasks import lists
from cropi.tasks.base import POOL, WARMSTART, Task
from cropi.tasks.sampling import draw_split

TARGETS = {"max": ("val_max", "test_max"), "min": ("val_min", "test_min")}
TARGET_SHARE = 0.05  # of the pool, per targeted skill
SIZES = {POOL: 1200, "val_max": 100, "val_min": 100, "test_max": 200, "test_min": 200, WARMSTART: 20000}


def mixture(split: str) -> dict[str, float]:
    """Skill weights of a split (levels always even)."""
    if split == POOL:
        rest = [s for s in lists.SKILLS if s not in TARGETS]
        return {s: TARGET_SHARE for s in TARGETS} | {s: (1 - TARGET_SHARE * len(TARGETS)) / len(rest) for s in rest}
    kind, _, skill = split.partition("_")
    if kind in ("val", "test") and skill in TARGETS:
        return {skill: 1.0}
    raise InvalidInputError(f"unknown split {split!r}; expected one of {', '.join(SIZES)}")


def make_splits(seed: int, sizes: Mapping[str, int]) -> dict[str, list[PromptRecord]]:
    """Every split named in ``sizes``; deterministic in ``seed``; no problem in two splits nor in any
    `lists` split. Tests first, then validation, then the pool, each from its own seeded stream."""
    for name, n in sizes.items():
        if name != WARMSTART:
            mixture(name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInputError(f"{name} size must be a positive integer, got {n!r}")
    if sizes.get(WARMSTART, 0) > lists.SIZES[WARMSTART]:
        raise InvalidInputError(f"the warm-start set is lists' own: at most {lists.SIZES[WARMSTART]} problems")
    drawn_lists = lists.make_splits(seed, lists.SIZES)
    seen = {r.prompt[-1]["content"] for split in drawn_lists.values() for r in split}
    order = [*(f"test_{s}" for s in TARGETS), *(f"val_{s}" for s in TARGETS), POOL]
    out = {name: draw_split(random.Random(f"cropi.scarce:{seed}:{name}"), mixture(name), lists.LEVELS, sizes[name],
                            seen, lists._fresh, lists._TRIES) for name in order if name in sizes}
    if WARMSTART in sizes:
        out[WARMSTART] = drawn_lists[WARMSTART][:sizes[WARMSTART]]
    return {name: out[name] for name in sizes}


TASK = Task(
    name="scarce", make_splits=make_splits, targets=TARGETS, sizes=SIZES, max_new_tokens=lists.TASK.max_new_tokens,
    warm_start=dict(lists.TASK.warm_start), model_of="lists",
    description="lists' problems, the targets (max, min) a tenth of the pool",
    fields={"answer_position": lists.answer_position})
