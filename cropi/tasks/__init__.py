"""Synthetic verifiable tasks for demos and tests."""

from cropi.tasks.arithmetic import (LEVELS, SKILLS, TARGETS, evaluate, make_record, make_task_splits, mixture,
                                    solution_text)
from cropi.tasks.sampling import TaskSizeError

__all__ = ["make_task_splits", "solution_text", "make_record", "evaluate", "mixture", "SKILLS", "LEVELS",
           "TARGETS", "TaskSizeError"]
