"""Synthetic verifiable tasks for demos and tests."""

from cropi.tasks.arithmetic import (LEVELS, SKILLS, TARGETS, TaskSizeError, evaluate, make_record,
                                    make_task_splits, mixture, solution_text)

__all__ = ["make_task_splits", "solution_text", "make_record", "evaluate", "mixture", "SKILLS", "LEVELS",
           "TARGETS", "TaskSizeError"]
