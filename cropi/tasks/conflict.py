"""A task where the pool's majority teaches the opposite of the target: `lists`' problems and model,
the target `before` (the number right before X), half the pool `after` (the number right after X).

Built for issue 32's second round (docs/demo.md), before any selector ran on it: on `lists`, full-pool
training drove `test_before` from 0.068 to 0.005 within 20 steps while `test_after` rose (task_probe.json),
so training on the neighbouring rule hurts this one. A subset concentrated on the pool's `before` prompts
(10%) is then the real skill, and the rest of the pool works against it. The splits are drawn as every
remix's (cropi.tasks.remix).
"""

from __future__ import annotations

from cropi.tasks.remix import remix

TARGETS = ("before",)
POOL_MIXTURE = {"after": 0.5, "before": 0.1, "max": 0.1, "min": 0.1, "above": 0.1, "nth": 0.1}

TASK = remix("conflict", TARGETS, POOL_MIXTURE,
             "lists' problems, the target before; half the pool after (the neighbouring rule)")
