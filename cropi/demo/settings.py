"""The demo's settings: the full run and ``--quick``, with every knob in one place.

Split sizes are bounded by the task's own (every demo split is a prefix of the task's
split at its largest size); the response length and the reward are the task's unless set.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cropi.errors import InvalidInputError, format_validation_error
from cropi.tasks.base import DEFAULT_TASK, POOL, Task, load_task

# The comparison: the default (``checked``: CROPI's rule with the stage check, cropi.pipeline.curriculum.check),
# CROPI's rule and diverse unchecked, the pool, and the cheap control it has to beat: ``informative`` (a random
# fraction of the mixed-reward prompts) isolates what influence adds over a variance filter. Issue 32 names these
# five; ``random``, ``pass_rate`` and ``oracle`` (CONTROLS) were in the default set up to round 10 and are opt-in
# with ``methods`` since, so that `make demo` fits its 15 minutes on 2 cores (the decisions never read them; the
# committed reports keep them). Every other selector of the registry (cropi.selection) is a method too.
DEFAULT_METHOD = "checked"
METHODS = (DEFAULT_METHOD, "cropi", "diverse", "full", "informative")
CONTROLS = ("random", "pass_rate", "oracle")
QUICK_POOL_SIZE = 360  # --quick's pool (at most the task's)
# CROPI with one scoring option changed (opt-in with ``methods``): demo method -> curriculum config fields; a
# ``selector`` there replaces CROPI's rule as the curriculum's selector (``selection_of``).
# Every variant below up to checked_halfrace ran, and stays, with revision 12's widening: a saturated part widens at
# once (check.widen_when: saturated); revision 16 (round 16, docs/demo.md) widens it only once its rise is not resolved.
# Every variant ran, and stays, with the race its revision had: a whole part (check.race_length: part) unless it says
# otherwise; revision 19 (round 19) reads the race at half a part and goes on to a whole one only where unresolved.
_WHOLE_RACE = {"race_length": "part"}
_AT_ONCE = {"widen_when": "saturated", **_WHOLE_RACE}
VARIANTS: dict[str, dict[str, Any]] = {DEFAULT_METHOD: {"check": {"enabled": True}},
                                       "cropi_by_answer": {"validation_groups": "answer"},
                                       "cropi_theta": {"loss": {"advantage": "theta"}},
                                       # issue 18's refresh at the setting benchmarks/offpolicy.py measured
                                       "cropi_theta_refresh": {"loss": {"advantage": "theta"},
                                                               "refresh": {"criterion": "status", "above": 0.5,
                                                                           "budget": 0.2}},
                                       # the checked curriculum as issue 32's revision 8 left it: theta_0's groups
                                       # ranked at every stage, none refreshed (check.refresh, docs/demo.md round 9)
                                       "checked_rev8": {"check": {"enabled": True, "refresh": "never", **_AT_ONCE}},
                                       # revision 9: theta_0's groups refreshed both ways, mixed ones too (the
                                       # default refreshes only the all-equal ones: revision 10, docs/demo.md)
                                       "checked_rev9": {"check": {"enabled": True, "refresh": "status", **_AT_ONCE}},
                                       # revision 10: a widened subset is the arm's own pick, which stops at its
                                       # candidates (the default fills it to its share of the pool: revision 11)
                                       "checked_rev10": {"check": {"enabled": True, "widened": "selection",
                                                                   **_AT_ONCE}},
                                       # revision 11: every stage's sample sized from theta_0's variance, no floor
                                       # (the default sizes it at the stage's start: revision 12)
                                       "checked_rev11": {"check": {"enabled": True, "sizing": "theta_0", **_AT_ONCE}},
                                       # exploratory after the held-out readings (docs/demo.md): no race, diverse
                                       # the primary arm and CROPI's rule the fallback; the rest revision 12
                                       "checked_norace": {"selector": "diverse",
                                                          "check": {"enabled": True, "race": False,
                                                                    "fallback": "cropi", **_AT_ONCE}},
                                       # exploratory after the rare-target readings (docs/demo.md): saturation judged
                                       # against the pool read at each stage's start; the rest revision 12
                                       "checked_flatref": {"check": {"enabled": True,
                                                                     "saturation_reference": "stage_start",
                                                                     **_AT_ONCE}},
                                       # the revision 13 candidate (docs/demo.md): a saturated part's widening is
                                       # raced against the current subset; the rest revision 12
                                       "checked_widerace": {"check": {"enabled": True, "widen_check": "race",
                                                                      **_AT_ONCE}},
                                       # the revision 14 candidate (docs/demo.md): the screen at alpha itself, the
                                       # confirmation at alpha / C; the rest revision 12
                                       "checked_screen": {"check": {"enabled": True, "screen": "alpha", **_AT_ONCE}},
                                       # the round 15 candidate (docs/demo.md): each arm of the race trains half a
                                       # part; the rest revision 12
                                       "checked_halfrace": {"check": {"enabled": True, **_AT_ONCE,
                                                                      "race_length": "half"}},
                                       # the round 16 candidate, now the default (revision 16): a saturated part
                                       # widens only when its rise is not resolved
                                       "checked_stalled": {"check": {"enabled": True, "widen_when": "stalled",
                                                                     **_WHOLE_RACE}},
                                       # revision 12, the default before round 16
                                       "checked_rev12": {"check": {"enabled": True, **_AT_ONCE}},
                                       # the round 17 candidate (docs/demo.md): a widened subset leaves out the pool
                                       # prompts of negative gain; the rest revision 16
                                       "checked_noharm": {"check": {"enabled": True, "widened": "no_harm",
                                                                    **_WHOLE_RACE}},
                                       # the round 18 candidate (docs/demo.md): each arm of the race trains half a
                                       # part; the rest revision 16
                                       "checked_half16": {"check": {"enabled": True, "race_length": "half"}},
                                       # the round 19 candidate, now the default (revision 19): the race read at half
                                       # a part, on to a whole part only where that lead is not resolved
                                       "checked_seq": {"check": {"enabled": True, "race_length": "sequential",
                                                                 "race_futility": "never"}},
                                       # revision 16, the default before round 19: the race a whole part
                                       "checked_rev16": {"check": {"enabled": True, **_WHOLE_RACE}},
                                       # the round 20 candidate (docs/demo.md): revision 19, a race unresolved at
                                       # its last look going on with the fallback
                                       "checked_unres": {"check": {"enabled": True, "race_length": "sequential",
                                                                   "race_unresolved": "fallback",
                                                                   "race_futility": "never"}},
                                       # the round 21 candidate, the default since round 22 (revision 22): the race
                                       # read on every validation prompt not held out to confirm a fall
                                       "checked_raceread": {"check": {"enabled": True, "race_length": "sequential",
                                                                      "race_sample": "rest", "race_futility": "never"}},
                                       # revision 19, the default before round 22: the race read on the check's sample
                                       "checked_rev19": {"check": {"enabled": True, "race_sample": "check"}},
                                       # the round 23 candidate (revision 23, the default until round 24):
                                       # a race whose winner shows no gain over the stage's start goes on at the
                                       # whole pool, from the winner's checkpoint
                                       "checked_nogain": {"check": {"enabled": True, "race_no_gain": "pool",
                                                                    "race_gain": "any", "no_gain_draw": "pool",
                                                                    "race_futility": "never"}},
                                       # revision 22, the default before round 23: every race's winner goes on with
                                       # its own subset
                                       "checked_rev22": {"check": {"enabled": True, "race_no_gain": "keep"}},
                                       # the round 24 candidate (revision 24, the default until round 25): where a
                                       # race shows no gain, the pool trains from the check's best checkpoint, not
                                       # the winner's
                                       "checked_restart": {"check": {"enabled": True, "race_no_gain": "restart",
                                                                     "race_gain": "any", "no_gain_draw": "pool",
                                                                     "race_futility": "never"}},
                                       # the round 25 candidate (revision 25, the default until round 27): a race's
                                       # gain over the start counts only where resolved at alpha, the pool its draw
                                       "checked_resolved": {"check": {"enabled": True, "race_gain": "resolved",
                                                                      "no_gain_draw": "pool",
                                                                      "race_futility": "never"}},
                                       # the round 26 candidate: the pool the no-gain action took is revisited by a
                                       # race of the ranked subset against it
                                       "checked_revisit": {"check": {"enabled": True, "pool_revisit": "race",
                                                                     "no_gain_draw": "pool", "race_futility": "never"}},
                                       # the round 27 candidate (revision 26, the default until round 29): the
                                       # no-gain action trains the pool's mixed prompts
                                       "checked_mixed": {"check": {"enabled": True, "no_gain_draw": "mixed",
                                                                   "race_futility": "never"}},
                                       # the round 28 candidate (not adopted: docs/demo.md): the no-gain action's
                                       # draw goes on from the higher of the stage's start and the race's winner
                                       "checked_higher": {"check": {"enabled": True, "race_no_gain": "higher",
                                                                    "race_futility": "never"}},
                                       # the round 29 candidate, now the default (revision 27): a sequential race
                                       # stops at its first look where the higher arm reads at or below the
                                       # stage's start (a futility bound)
                                       "checked_futile": {"check": {"enabled": True, "race_futility": "stop"}},
                                       # revision 26, the default before round 29: every unresolved first look
                                       # goes on
                                       "checked_rev26": {"check": {"enabled": True, "race_futility": "never"}},
                                       # the round 30 candidate (not adopted: docs/demo.md): a winner decided at
                                       # the first look whose gain over the start is above zero, not resolved,
                                       # trains on to its whole part before the no-gain test
                                       "checked_gainseq": {"check": {"enabled": True,
                                                                     "race_gain_length": "sequential"}},
                                       # the round 31 candidate (not adopted: docs/demo.md): an unresolved first
                                       # look whose higher half's gain over the start is resolved stops the race
                                       # (the higher half goes on)
                                       "checked_efficacy": {"check": {"enabled": True, "race_efficacy": "stop"}}}


def is_checked(method: str) -> bool:
    """Whether a demo method runs the checked curriculum (its VARIANTS entry enables the check)."""
    return bool(VARIANTS.get(method, {}).get("check", {}).get("enabled", False))


# Online influence filters inside the trainer (docs/online_filtering.md), opt-in with ``methods``
# (outside the default list and its 15-minute budget): demo method -> (the stage's selection, filter policy).
ONLINE_METHODS = {"ippo": ("full", "ippo"), "iif": ("full", "iif"), "random_filter": ("full", "random"),
                  "cropi+iif": ("cropi", "iif")}


class DemoSettingsError(InvalidInputError):
    """Demo settings that cannot run."""


class DemoSettings(BaseModel):
    """What one ``cropi demo`` run does. The defaults are the full run (see ``quick``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(DEFAULT_TASK, description="built-in task name or module:attribute (cropi.tasks.Task)")
    seeds: int = Field(3, ge=1, description="training seeds per method")
    methods: tuple[str, ...] = METHODS
    pool_size: int = Field(1200, ge=18, description="pool prompts (at most the task's pool)")
    val_size: int = Field(100, ge=3, description="prompts per targeted validation set")
    test_size: int = Field(200, ge=3, description="prompts per targeted test split")
    stages: int = Field(5, ge=1)
    steps_per_stage: int = Field(40, ge=1)
    select_fraction: float = Field(0.1, gt=0, le=1, description="CROPI, random and p(1-p): share of the pool")
    pool_samples: int = Field(8, ge=2, description="K per pool prompt (CROPI: 8)")
    validation_samples: int = Field(16, ge=2, description="K per validation prompt (CROPI: 32)")
    temperature: float = Field(0.5, gt=0, description="sampling temperature of the offline trajectories (CROPI)")
    max_new_tokens: Optional[int] = Field(None, gt=0, description="longest response: collection, training, "
                                          "evaluation (default: the task's)")
    # scoring projects with the one default (cropi.projection.spec.DEFAULT_SPEC); these two size the demo's
    # own sjlt projection of the online filters (per response, where packing cannot serve)
    projection_dim: int = Field(2048, ge=16, description="online filters: the sjlt projection's dim")
    kept_fraction: float = Field(0.1, gt=0, le=1, description="online filters: the sjlt projection's kept fraction")
    lr: float = Field(3e-4, gt=0)
    batch_prompts: int = Field(16, ge=1, description="prompts a GRPO step (16: the steadiest full-pool curves of "
                                                     "benchmarks/results/demo/task_probe.json)")
    rollouts: int = Field(8, ge=2)
    kl_coef: float = Field(0.0, ge=0, description="KL to theta_0 (0: off, as DAPO; CROPI used 0.001)")
    eval_every: int = Field(10, ge=1, description="global steps between test evaluations")
    eval_samples: int = Field(4, ge=1, description="k of the sampled test accuracy mean@k")
    reward: Optional[str] = Field(None, description="reward name (default: the task's)")
    workers: int = Field(2, ge=1, description="processes running curricula side by side (one per core)")
    check_samples: int = Field(4, ge=1, description="the checked method: draws per validation prompt at a check")
    iif_p: float = Field(0.25, gt=0, le=1, description="online methods iif, random_filter, cropi+iif: IIF's p")

    @model_validator(mode="before")
    @classmethod
    def _fit_task(cls, data: Any) -> Any:
        """Split sizes not given explicitly are capped at the task's own (a small task of a user's)."""
        if not isinstance(data, dict):
            return data
        largest = _largest(load_task(data.get("task", DEFAULT_TASK)))
        return {name: min(cls.model_fields[name].default, most) for name, most in largest.items()} | data

    @model_validator(mode="after")
    def _known_methods(self) -> "DemoSettings":
        known = known_methods()
        unknown = [m for m in self.methods if m not in known]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {known}")
        if "full" not in self.methods:  # every acceleration is against it (a task probe may run full alone)
            raise ValueError("the demo measures against full-pool training: keep 'full' in methods")
        if self.stages * self.steps_per_stage < 2 and any(map(is_checked, self.methods)):
            raise ValueError("a checked curriculum needs at least 2 steps in all")
        if self.pool_size < self.batch_prompts:  # a smaller stage subset is filled to a batch; the pool cannot be
            raise ValueError(f"pool_size {self.pool_size} is smaller than one training step's batch_prompts "
                             f"{self.batch_prompts}: lower batch_prompts, or give the task a larger pool")
        task = self.load_task()
        too_big = [f"{name} {getattr(self, name)} (at most {most})" for name, most in _largest(task).items()
                   if getattr(self, name) > most]
        if too_big:
            raise ValueError(f"task {task.name!r} has fewer prompts than asked: {', '.join(too_big)}")
        return self

    def load_task(self) -> Task:
        return load_task(self.task)

    def resolved(self) -> "DemoSettings":
        """These settings with the task's response length and reward filled in."""
        task = self.load_task()
        return self.model_copy(update={"max_new_tokens": self.max_new_tokens or task.max_new_tokens,
                                       "reward": self.reward or task.reward})

    @classmethod
    def quick(cls, **overrides: Any) -> "DemoSettings":
        """Every method, a smaller pool, fewer steps and seeds: under 3 minutes on 2 cores."""
        largest = _largest(load_task(overrides.get("task", DEFAULT_TASK)))
        small = dict(seeds=2, pool_size=min(QUICK_POOL_SIZE, largest["pool_size"]), val_size=min(24, largest["val_size"]),
                     test_size=min(60, largest["test_size"]), stages=2, steps_per_stage=15, validation_samples=8,
                     projection_dim=512, eval_every=5, eval_samples=4, select_fraction=0.25, batch_prompts=8,
                     check_samples=8)  # 24 validation prompts a set resolve the check's margin at 8 draws, not 4
        return cls(**(small | overrides))

    @classmethod
    def make(cls, *, quick: bool = False, **overrides: Any) -> "DemoSettings":
        """The full or quick settings with ``overrides``; bad values raise ``DemoSettingsError``."""
        try:
            return cls.quick(**overrides) if quick else cls(**overrides)
        except ValidationError as e:
            raise DemoSettingsError(f"bad demo settings: {format_validation_error(e, 'settings')}") from None

    @property
    def total_steps(self) -> int:
        return self.stages * self.steps_per_stage

    def split_sizes(self) -> dict[str, int]:
        """Prompts per split; each split is a prefix of the task's split drawn at its full size."""
        sizes = {POOL: self.pool_size}
        for val, test in self.load_task().targets.values():
            sizes |= {val: self.val_size, test: self.test_size}
        return sizes

    def trainer_options(self, test_files: dict[str, str], method: str = "full",
                        validation_files: dict[str, str] | None = None) -> dict[str, Any]:
        options = {"lr": self.lr, "batch_prompts": self.batch_prompts, "rollouts": self.rollouts,
                   "kl_coef": self.kl_coef, "max_new_tokens": self.max_new_tokens, "eval_files": test_files,
                   "eval_every": self.eval_every, "eval_samples": self.eval_samples,
                   # a checked stage measures the validation sets itself (its checks); the others read them at
                   # every stage's start and end for the report's diagnostics
                   "stage_eval_files": {} if is_checked(method) else dict(validation_files or {})}
        if method in ONLINE_METHODS:
            policy = ONLINE_METHODS[method][1]
            online = {"policy": policy, "projection": {"kind": "sjlt", "dim": self.projection_dim,
                                                       "kept_fraction": self.kept_fraction}}
            if policy == "ippo":
                online["validation_files"] = dict(validation_files or {})
            else:
                online["p"] = self.iif_p
            options["online_filter"] = online
        return options


def known_methods() -> list[str]:
    """Every selector of the registry, then the CROPI variants and the online filters."""
    from cropi.selection import SELECTORS

    return list(dict.fromkeys([*METHODS, *CONTROLS, *(s for s in SELECTORS if s not in METHODS), *VARIANTS,
                               *ONLINE_METHODS]))


def selection_of(method: str) -> str:
    """The selector a demo method's curriculum uses."""
    if method in ONLINE_METHODS:
        return ONLINE_METHODS[method][0]
    return VARIANTS[method].get("selector", "cropi") if method in VARIANTS else method


def _largest(task: Task) -> dict[str, int]:
    """The largest pool, validation and test sizes ``task`` can give (every demo split is a prefix)."""
    return {"pool_size": task.sizes[POOL], "val_size": min(task.sizes[v] for v in task.validation_splits()),
            "test_size": min(task.sizes[t] for t in task.test_splits())}
