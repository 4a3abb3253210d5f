"""What a demo task is (the protocol ``cropi demo --task`` runs), the built-in tasks, and loading one.

A task is a ``Task`` object: a generator of prompt splits with verifiable answers, the
targeted skills (each with a validation split and a held-out test split), the reward
that scores a response, how long a response may be, and the supervised warm-start
recipe that builds its initial model. ``cropi demo --task NAME`` runs a built-in task;
``--task module:attribute`` runs one defined anywhere importable (docs/demo.md has a
worked example), so a user compares CROPI with the baselines on a task of their own
without editing cropi.

Every record's ``data_source`` names its skill (the oracle baseline and the selection
diagnostics group by it) and its ``answer`` is the ground truth the reward checks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from cropi.data.records import PromptRecord
from cropi.errors import InvalidInputError
from cropi.tasks.sampling import TaskSizeError  # noqa: F401 (re-exported with the protocol)

POOL, WARMSTART = "pool", "warmstart"
# name -> "module:attribute"; imported only when asked for
BUILTIN = {"lists": "cropi.tasks.lists:TASK", "skills": "cropi.tasks.skills:TASK", "scarce": "cropi.tasks.scarce:TASK",
           "conflict": "cropi.tasks.conflict:TASK"}
DEFAULT_TASK = "lists"

Splits = dict[str, list[PromptRecord]]


class TaskError(InvalidInputError):
    """A task that cannot be loaded or does not follow the protocol."""


@dataclass(frozen=True)
class Task:
    """One verifiable task family.

    ``make_splits(seed, sizes)`` returns every split named in ``sizes`` (``pool``, each
    target's validation and test split, ``warmstart``), no problem in two splits, the same
    records for the same seed. ``sizes`` here are the largest the demo may ask for: every
    demo split is a prefix of the split drawn at that size. ``warm_start`` holds the fields
    of ``cropi.models.warmstart.WarmStartConfig`` (the recipe; its ``stop_at`` is the
    snapshot the design criteria picked). ``response_text`` is what the warm start teaches
    the model to answer (default: the answer itself).
    """

    name: str
    make_splits: Callable[[int, Mapping[str, int]], Splits]
    targets: Mapping[str, tuple[str, str]]  # skill -> (validation split, test split)
    sizes: Mapping[str, int]
    warm_start: Mapping[str, Any]
    max_new_tokens: int
    reward: str = "exact_numeric"
    seed: int = 0
    response_text: Callable[[PromptRecord], str] = field(default=lambda r: r.answer)
    description: str = ""
    # name -> record -> value: latent features a selection may skew toward (a shortcut the targets
    # share), checked for every stage subset beside the answer labels (cropi.scoring.diagnostics.field_skew)
    fields: Mapping[str, Callable[[PromptRecord], str]] = field(default_factory=dict)
    # the built-in task whose shipped model is this one's initial model (the same recipe and warm-start set)
    model_of: str = ""

    def __post_init__(self) -> None:
        missing = [s for s in [POOL, WARMSTART, *self.target_splits()] if s not in self.sizes]
        if missing:
            raise TaskError(f"task {self.name!r}: sizes lacks {missing}; give the largest size of every split")
        if not self.targets:
            raise TaskError(f"task {self.name!r} names no targets: give skill -> (validation split, test split)")

    def target_splits(self) -> list[str]:
        return [s for pair in self.targets.values() for s in pair]

    def validation_splits(self) -> list[str]:
        return [val for val, _ in self.targets.values()]

    def test_splits(self) -> list[str]:
        return [test for _, test in self.targets.values()]

    def splits(self) -> Splits:
        """Every split at its largest size: the demo takes prefixes of these."""
        drawn = self.make_splits(self.seed, dict(self.sizes))
        short = {n: (len(drawn.get(n, [])), size) for n, size in self.sizes.items() if len(drawn.get(n, [])) < size}
        if short:
            raise TaskError(f"task {self.name!r}: make_splits returned fewer records than asked: {short}")
        return drawn


def load_task(spec: str) -> Task:
    """A built-in task by name, or ``module:attribute`` naming a ``Task`` (or a function returning one)."""
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise TaskError(f"unknown task {spec!r}: use one of {sorted(BUILTIN)} or module:attribute naming a "
                        "cropi.tasks.Task defined in an importable module")
    module_name, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise TaskError(f"cannot load task {spec!r}: {e}. Check that the module is importable (on PYTHONPATH) "
                        "and defines that attribute") from None
    task = obj() if callable(obj) and not isinstance(obj, Task) else obj
    if not isinstance(task, Task):
        raise TaskError(f"{spec!r} is a {type(task).__name__}, not a cropi.tasks.Task")
    return task
