"""A task where the targets' skill is scarce in the pool: `lists`' problems and warm-started model, but
the two targeted skills make up a tenth of the pool (cropi.tasks.remix says how the splits are drawn).

The regime meant to make a concentrated selection the real skill (issue 32): the targets are `max` and
`min` (both in range for `lists`' shipped model, docs/demo.md), each 5% of the pool; the other four skills
share the rest evenly. Their answers spread over 900 values and, for both skills, the answer's position in
the list is uniform (no positional shortcut, unlike the `last number` one `lists` offered CROPI's rule).
It did not do what it was built for: the other skills transfer to the targets (docs/demo.md).
"""

from __future__ import annotations

from cropi.tasks import lists
from cropi.tasks.remix import remix

TARGETS = ("max", "min")
TARGET_SHARE = 0.05  # of the pool, per targeted skill
_REST = [s for s in lists.SKILLS if s not in TARGETS]

TASK = remix("scarce", TARGETS, {**{s: TARGET_SHARE for s in TARGETS},
                                 **{s: (1 - TARGET_SHARE * len(TARGETS)) / len(_REST) for s in _REST}},
             "lists' problems, the targets (max, min) a tenth of the pool")
