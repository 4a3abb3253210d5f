"""Tasks made of a built-in task's problems and shipped model with another pool mixture and other targets.

The built-in task is the *base*: `lists` (the default) or `skills`, any module with ``SKILLS``, ``LEVELS``,
``SIZES``, ``TASK``, ``TRIES`` and ``problem(rng, skill, level)``. A remix draws every split of its base first
(at its full sizes) and repeats none of their problems; its warm-start set *is* the base's own, so the base's
shipped model is its initial model (``Task.model_of``) and none of its test or validation problems was in that
model's supervised set. Its splits are the targets' ``val_<skill>`` / ``test_<skill>`` (one skill each) and a
pool of the given skill mixture, drawn tests first, then validation, then the pool, each from its own seeded
stream.
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Mapping

from cropi.data.records import PromptRecord
from cropi.errors import InvalidInputError
from cropi.tasks import lists
from cropi.tasks.base import POOL, WARMSTART, Task
from cropi.tasks.sampling import draw_split


def remix(name: str, targets: tuple[str, ...], pool: Mapping[str, float], description: str,
          base: ModuleType = lists) -> Task:
    """A remix of ``base`` (a built-in task's module; `lists` unless given): ``targets`` (skills of the base)
    with their own validation and test splits, and a pool drawn from the skill weights ``pool`` (summing to 1)."""
    own = base.TASK.name
    unknown = [s for s in (*targets, *pool) if s not in base.SKILLS]
    if unknown or abs(sum(pool.values()) - 1) > 1e-9:
        raise ValueError(f"remix {name!r}: skills must be the {own} task's ({unknown}) and the pool's weights sum to 1")
    target_splits = {s: (f"val_{s}", f"test_{s}") for s in targets}
    sizes = {POOL: 1200, **{v: 100 for v, _ in target_splits.values()},
             **{t: 200 for _, t in target_splits.values()}, WARMSTART: base.SIZES[WARMSTART]}

    def mixture(split: str) -> dict[str, float]:
        """Skill weights of a split (levels always even)."""
        if split == POOL:
            return dict(pool)
        kind, _, skill = split.partition("_")
        if kind in ("val", "test") and skill in target_splits:
            return {skill: 1.0}
        raise InvalidInputError(f"unknown split {split!r}; expected one of {', '.join(sizes)}")

    def make_splits(seed: int, asked: Mapping[str, int]) -> dict[str, list[PromptRecord]]:
        """Every split named in ``asked``; deterministic in ``seed``; no problem in two splits nor in any
        split of the base."""
        for split, n in asked.items():
            if split != WARMSTART:
                mixture(split)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InvalidInputError(f"{split} size must be a positive integer, got {n!r}")
        if asked.get(WARMSTART, 0) > base.SIZES[WARMSTART]:
            raise InvalidInputError(f"the warm-start set is the {own} task's own: at most {base.SIZES[WARMSTART]} "
                                    "problems")
        drawn_base = base.make_splits(seed, base.SIZES)
        seen = {r.prompt[-1]["content"] for split in drawn_base.values() for r in split}
        order = [*(t for _, t in target_splits.values()), *(v for v, _ in target_splits.values()), POOL]
        out = {split: draw_split(random.Random(f"cropi.{name}:{seed}:{split}"), mixture(split), base.LEVELS,
                                 asked[split], seen, base.problem, base.TRIES) for split in order if split in asked}
        if WARMSTART in asked:
            out[WARMSTART] = drawn_base[WARMSTART][:asked[WARMSTART]]
        return {split: out[split] for split in asked}

    return Task(name=name, make_splits=make_splits, targets=target_splits, sizes=sizes,
                max_new_tokens=base.TASK.max_new_tokens, warm_start=dict(base.TASK.warm_start), model_of=own,
                response_text=base.TASK.response_text, description=description, fields=dict(base.TASK.fields))
