"""Held-out-style tasks defined outside the package, for a robustness sweep of the default through
`cropi demo --task robustness_tasks:NAME` (PYTHONPATH=benchmarks): a target alone, three targets, a pool smaller
than ten batches, a validation set of 10 prompts, a reward of the task's own. Results and the commands:
benchmarks/results/demo/robustness/robustness.json."""

from __future__ import annotations

import dataclasses
import re

from cropi.rewards import register_reward
from cropi.tasks import lists, skills
from cropi.tasks.remix import remix

UNIFORM = {s: 1 / len(lists.SKILLS) for s in lists.SKILLS}


@register_reward("robustness_last_number", replace=True)
def last_number(text: str, answer: str) -> float:
    """A task's own reward: the last integer in the response is the answer."""
    found = re.findall(r"-?\d+", text)
    return 1.0 if found and found[-1] == answer.strip() else 0.0


ONE = remix("one", ("nth",), UNIFORM, "one target")
THREE = remix("three", ("above", "after", "before"), UNIFORM, "three targets")
_small = remix("smallpool", ("max",), UNIFORM, "a pool of 150")
SMALLPOOL = dataclasses.replace(_small, sizes={**_small.sizes, "pool": 150})
_tiny = remix("tinyval", ("max", "min"), UNIFORM, "a validation set of 10")
TINYVAL = dataclasses.replace(_tiny, sizes={**_tiny.sizes, "val_max": 10, "val_min": 100})
CUSTOM = dataclasses.replace(remix("custom", ("nth",), UNIFORM, "its own reward"), reward="robustness_last_number")
# a second held-out reading of the default (docs/demo.md, fixed before its run): two targets no rule was chosen on
PAIR = remix("pair", ("min", "above"), {"min": 0.1, "above": 0.1, "nth": 0.3, "after": 0.3, "max": 0.1, "before": 0.1},
             "min and above, a fifth of a pool that is mostly nth and after")
# a third held-out reading (docs/demo.md, fixed before its run): the pool mostly the two skills the model is worst at
SKEWED = remix("skewed", ("nth", "min"), {"nth": 0.1, "min": 0.1, "above": 0.3, "before": 0.3, "max": 0.1, "after": 0.1},
               "nth and min, a fifth of a pool that is mostly above and before")
# A fourth kind of held-out reading (docs/demo.md, fixed before any run on them): the targets a twentieth or less of the
# pool, so that training on their own prompts is the skill and the rest of the pool dilutes or contradicts it, the
# regime of the held-out task 2. Each is run further only if its oracle beats full-pool training (seed 0).
_REST = {s: 0.19 for s in ("max", "min", "after", "before", "above")}
RARE_NTH = remix("rare_nth", ("nth",), {"nth": 0.05, **_REST}, "nth, a twentieth of a pool of the five other skills")
_AMID_POOL = {"after": 0.05, "before": 0.5, **{s: 0.1125 for s in ("max", "min", "above", "nth")}}
AMID = remix("amid", ("after",), _AMID_POOL,
             "after, a twentieth of a pool half of which is before, its mirror rule")
RARE_PAIR = remix("rare_pair", ("nth", "after"),
                  {"nth": 0.04, "after": 0.04, **{s: 0.23 for s in ("max", "min", "above", "before")}},
                  "nth and after, 4% of the pool each")
# Three fresh tasks for the widening race (docs/demo.md, "revision 13 candidate"; committed with its design, before
# any run on them): a small uniform pool, a rare target beside its mirror rule, a pool mostly target.
_mid = remix("midpool", ("max", "nth"), UNIFORM, "max and nth, a uniform pool of 400")
MIDPOOL = dataclasses.replace(_mid, sizes={**_mid.sizes, "pool": 400})
MIRROR = remix("mirror", ("before",), {"before": 0.1, "after": 1 / 3, **{s: (1 - 0.1 - 1 / 3) / 4
                                                                         for s in ("max", "min", "above", "nth")}},
               "before, a tenth of a pool a third of which is after, its mirror rule")
BROAD = remix("broad", ("min", "after", "nth"), {"min": 0.2, "after": 0.2, "nth": 0.2, "max": 0.4 / 3,
                                                 "above": 0.4 / 3, "before": 0.4 / 3},
              "min, after and nth, 60% of the pool")
# Candidates for a task like the held-out task 2 (docs/demo.md, "round 15"; committed with its design, before
# any run on them), each tried in this order with the fixed rules alone until one has CROPI's rule ahead of `diverse`
# by at least 0.03 AUC over 3 seeds: `amid` (the task where CROPI's rule led most, +0.022) with its pool doubled, so
# that CROPI's subset passes its prompts half as often; `skewed` (+0.016) with its targets rarer; `amid` with more of
# its mirror rule.
_amid_big = remix("amid_big", ("after",), _AMID_POOL, "after, a twentieth of a pool of 2400 half of which is before")
AMID_BIG = dataclasses.replace(_amid_big, sizes={**_amid_big.sizes, "pool": 2400})
SKEWED_RARE = remix("skewed_rare", ("nth", "min"),
                    {"nth": 0.05, "min": 0.05, "above": 0.4, "before": 0.4, "max": 0.05, "after": 0.05},
                    "nth and min, a twentieth of the pool each, the pool mostly above and before")
HEAVY_MIRROR = remix("heavy_mirror", ("after",),
                     {"after": 0.05, "before": 0.7, **{s: 0.0625 for s in ("max", "min", "above", "nth")}},
                     "after, a twentieth of a pool 70% of which is before, its mirror rule")
# Three fresh held-out readings of revision 19 (docs/demo.md, "Fresh held-out readings of revision 19"; committed
# with their design, before any run on them): regimes none of the tasks above has.
HALF_MAX = remix("half_max", ("max",), {"max": 0.5, **{s: 0.1 for s in ("min", "nth", "after", "before", "above")}},
                 "max, half the pool")
BOTH_MIRRORS = remix("both_mirrors", ("before", "after"), UNIFORM,
                     "before and after, each the other's mirror rule, a uniform pool")
_rare_min_big = remix("rare_min_big", ("min",), {"min": 0.05, **{s: 0.19 for s in ("max", "nth", "after", "before",
                                                                                   "above")}},
                      "min, a twentieth of a pool of 2400 of the five other skills")
RARE_MIN_BIG = dataclasses.replace(_rare_min_big, sizes={**_rare_min_big.sizes, "pool": 2400})
# Held-out readings in the other task family (docs/demo.md, "Held-out readings on `skills` remixes"; committed with
# their design, before any run on them): every task above remixes `lists`; these remix `skills` (one-digit answers,
# its own shipped model), which no revision of the check was chosen on beyond `skills` itself.
_OTHERS = ("count", "maxd", "pos", "lastmul", "mind")
SKILLS_RARE_MOD = remix("skills_rare_mod", ("mod",), {"mod": 0.05, **{s: 0.19 for s in _OTHERS}},
                        "mod, a twentieth of a pool of the five other skills", base=skills)
SKILLS_AMID_MAXD = remix("skills_amid_maxd", ("maxd",),
                         {"maxd": 0.05, "mind": 0.5, **{s: 0.1125 for s in ("count", "pos", "mod", "lastmul")}},
                         "maxd, a twentieth of a pool half of which is mind, its mirror rule", base=skills)
# Fresh held-out readings of revision 22 (docs/demo.md, "Fresh held-out readings of revision 22"; committed with
# their design, before any run on them): regimes and skill pairs no revision was chosen on.
SKILLS_PAIR = remix("skills_pair", ("count", "pos"), {s: 1 / 6 for s in skills.SKILLS},
                    "count and pos, a uniform skills pool", base=skills)
# (first `lastmul` half the pool: its level-1 problems run out there, so the data phase stopped before any run)
SKILLS_HALF_MIND = remix("skills_half_mind", ("mind",),
                         {"mind": 0.5, **{s: 0.1 for s in ("count", "maxd", "pos", "mod", "lastmul")}},
                         "mind, half the skills pool", base=skills)
MAX_AMID_MIN = remix("max_amid_min", ("max",), {"max": 0.05, "min": 0.5, **{s: 0.1125 for s in
                                                                            ("after", "before", "above", "nth")}},
                     "max, a twentieth of a pool half of which is min, its opposite")
RARE_ABOVE_BEFORE = remix("rare_above_before", ("above", "before"),
                          {"above": 0.04, "before": 0.04, **{s: 0.23 for s in ("max", "min", "after", "nth")}},
                          "above and before, 4% of the pool each")
# Fresh held-out tasks of round 24 (docs/demo.md, "Round 24 candidate"; committed with its design, before any run on
# them): a target that is half the pool, the regime where revision 23's rule first acted, in both families.
SKILLS_HALF_POS = remix("skills_half_pos", ("pos",),
                        {"pos": 0.5, **{s: 0.1 for s in ("count", "maxd", "mind", "mod", "lastmul")}},
                        "pos, half the skills pool", base=skills)
SKILLS_HALF_COUNT = remix("skills_half_count", ("count",),
                          {"count": 0.5, **{s: 0.1 for s in ("maxd", "mind", "pos", "mod", "lastmul")}},
                          "count, half the skills pool", base=skills)
HALF_BEFORE = remix("half_before", ("before",),
                    {"before": 0.5, **{s: 0.1 for s in ("max", "min", "after", "above", "nth")}},
                    "before, half the lists pool")
# Fresh held-out readings of revision 25 (docs/demo.md, "Fresh held-out readings of revision 25"; committed with their
# design, before any run on them): a rare target amid its opposite, the regime where a ranked subset is the real skill
# (`amid`) and, reversed, where `informative` won (`max_amid_min`).
BEFORE_AMID_AFTER = remix("before_amid_after", ("before",),
                          {"before": 0.05, "after": 0.5, **{s: 0.1125 for s in ("max", "min", "above", "nth")}},
                          "before, a twentieth of a pool half of which is after, its mirror")
MIN_AMID_MAX = remix("min_amid_max", ("min",),
                     {"min": 0.05, "max": 0.5, **{s: 0.1125 for s in ("after", "before", "above", "nth")}},
                     "min, a twentieth of a pool half of which is max, its opposite")
# Fresh held-out readings of round 26 (docs/demo.md, "Round 26 candidate"; committed with its design, before any run on
# them): a rare target amid a broad one in the skills family, and a broad lists target, where the pool is right.
SKILLS_POS_AMID_COUNT = remix("skills_pos_amid_count", ("pos",),
                              {"pos": 0.05, "count": 0.5, **{s: 0.1125 for s in ("maxd", "mind", "mod", "lastmul")}},
                              "pos, a twentieth of a skills pool half of which is count", base=skills)
HALF_NTH = remix("half_nth", ("nth",), {"nth": 0.5, **{s: 0.1 for s in ("max", "min", "after", "before", "above")}},
                 "nth, half the lists pool")
# Fresh held-out readings of revision 27 (docs/demo.md, "Fresh held-out readings of revision 27"; committed with their
# design, before any run on them): a target that is a quarter of the pool, a share no task had, in both families.
QUARTER_AFTER = remix("quarter_after", ("after",),
                      {"after": 0.25, **{s: 0.15 for s in ("max", "min", "before", "above", "nth")}},
                      "after, a quarter of the lists pool")
# A quarter of the skills pool as one target, the others sharing the rest: mod and lastmul cannot supply 15% of the
# pool each as distinct problems (the demo stops at the data phase: "cannot draw another distinct lastmul problem"; so
# for mod), which the first design (lastmul a quarter, the other five 15% each) needed; they supply 10% (the
# skills_half_* tasks), so here they take 7.5% each and the three others 20% (docs/demo.md says so).
SKILLS_QUARTER_COUNT = remix("skills_quarter_count", ("count",),
                             {"count": 0.25, **{s: 0.2 for s in ("maxd", "mind", "pos")}, "mod": 0.075,
                              "lastmul": 0.075},
                             "count, a quarter of the skills pool", base=skills)
