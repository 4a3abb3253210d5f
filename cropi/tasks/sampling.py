"""How a task family draws a split: counts per (skill, level) cell and problems distinct across splits."""

from __future__ import annotations

import random
from typing import Callable

from cropi.data.records import PromptRecord, stable_prompt_id
from cropi.errors import InvalidInputError

# (rng, skill, level) -> (the text that must not repeat, the record)
Problem = Callable[[random.Random, str, int], tuple[str, PromptRecord]]


class TaskSizeError(InvalidInputError):
    """The requested split sizes cannot be met with distinct problems."""


def draw_split(rng: random.Random, mix: dict[str, float], levels: tuple[int, ...], n: int, seen: set[str],
               problem: Problem, tries: int) -> list[PromptRecord]:
    """``n`` records over ``mix``'s skills (levels equally weighted within a skill), shuffled; each
    distinct from every text in ``seen``, which they are added to."""
    cells = [(skill, level) for skill in mix for level in levels]
    weights = [mix[skill] / len(levels) for skill, _ in cells]
    records = []
    for (skill, level), count in zip(cells, apportion(n, weights)):
        for _ in range(count):
            records.append(_distinct(rng, skill, level, seen, problem, tries))
    rng.shuffle(records)
    return records


def _distinct(rng: random.Random, skill: str, level: int, seen: set[str], problem: Problem,
              tries: int) -> PromptRecord:
    for _ in range(tries):
        text, record = problem(rng, skill, level)
        if text not in seen:
            seen.add(text)
            return record
    raise TaskSizeError(f"cannot draw another distinct {skill} problem of level {level} "
                        f"({len(seen)} drawn so far); ask for smaller splits")


def apportion(n: int, weights: list[float]) -> list[int]:
    """Split ``n`` into integer counts proportional to ``weights`` (largest remainder, ties by order)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:n - sum(counts)]:
        counts[i] += 1
    return counts


def question_record(source: str, skill: str, level: int, question: str, answer: int) -> PromptRecord:
    """The record of a one-question chat prompt: its answer, ``data_source`` ``<source><skill>``, skill and level."""
    prompt = [{"role": "user", "content": question}]
    return PromptRecord(prompt_id=stable_prompt_id(prompt, str(answer)), prompt=prompt, answer=str(answer),
                        data_source=source + skill, extra_info={"skill": skill, "level": level})
