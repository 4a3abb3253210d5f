"""Synthetic verifiable tasks for demos and tests; ``Task`` is the protocol ``cropi demo --task`` runs."""

from cropi.tasks.arithmetic import (LEVELS, SKILLS, TARGETS, evaluate, make_record, make_task_splits, mixture,
                                    solution_text)
from cropi.tasks.base import BUILTIN, DEFAULT_TASK, Task, TaskError, TaskSizeError, load_task

__all__ = ["make_task_splits", "solution_text", "make_record", "evaluate", "mixture", "SKILLS", "LEVELS",
           "TARGETS", "TaskSizeError", "Task", "TaskError", "load_task", "BUILTIN", "DEFAULT_TASK"]
