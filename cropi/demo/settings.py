"""The demo's settings: the full run and ``--quick``, with every knob in one place."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cropi.errors import InvalidInputError

# The comparison: CROPI, the pool, and the selections it has to beat or approach.
METHODS = ("cropi", "full", "random", "pass_rate", "oracle")
# Online influence filters inside the trainer (docs/online_filtering.md), opt-in with ``methods``
# (outside the default list and its 15-minute budget): demo method -> (the stage's selection, filter policy).
ONLINE_METHODS = {"ippo": ("full", "ippo"), "iif": ("full", "iif"), "random_filter": ("full", "random"),
                  "cropi+iif": ("cropi", "iif")}


class DemoSettingsError(InvalidInputError):
    """Demo settings that cannot run."""


class DemoSettings(BaseModel):
    """What one ``cropi demo`` run does. The defaults are the full run (see ``quick``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: int = Field(3, ge=1, description="training seeds per method")
    methods: tuple[str, ...] = METHODS
    pool_size: int = Field(1200, ge=18, le=1200, description="pool prompts (all six skills, three levels)")
    val_size: int = Field(100, ge=3, le=100, description="prompts per targeted validation set")
    test_size: int = Field(200, ge=3, le=200, description="prompts per targeted test split")
    stages: int = Field(6, ge=1)
    steps_per_stage: int = Field(60, ge=1)
    select_fraction: float = Field(0.1, gt=0, le=1, description="CROPI, random and p(1-p): share of the pool")
    pool_samples: int = Field(8, ge=2, description="K per pool prompt (CROPI: 8)")
    validation_samples: int = Field(16, ge=2, description="K per validation prompt (CROPI: 32)")
    temperature: float = Field(0.5, gt=0, description="sampling temperature of the offline trajectories (CROPI)")
    max_new_tokens: int = Field(4, gt=0, description="longest response: collection, training, evaluation")
    projection_dim: int = Field(2048, ge=16)
    kept_fraction: float = Field(0.1, gt=0, le=1)
    lr: float = Field(3e-4, gt=0)
    batch_prompts: int = Field(8, ge=1)
    rollouts: int = Field(8, ge=2)
    kl_coef: float = Field(0.0, ge=0, description="KL to theta_0 (0: off, as DAPO; CROPI used 0.001)")
    eval_every: int = Field(10, ge=1, description="global steps between test evaluations")
    eval_samples: int = Field(4, ge=1, description="k of the sampled test accuracy mean@k")
    reward: str = "exact_numeric"
    workers: int = Field(2, ge=1, description="processes running curricula side by side (one per core)")
    iif_p: float = Field(0.25, gt=0, le=1, description="online methods iif, random_filter, cropi+iif: IIF's p")

    @model_validator(mode="after")
    def _known_methods(self) -> "DemoSettings":
        unknown = [m for m in self.methods if m not in METHODS and m not in ONLINE_METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS) + list(ONLINE_METHODS)}")
        if "full" not in self.methods or "cropi" not in self.methods:
            raise ValueError("the demo compares CROPI with full-pool training: keep 'cropi' and 'full' in methods")
        return self

    @classmethod
    def quick(cls, **overrides: Any) -> "DemoSettings":
        """Every method, a smaller pool, fewer steps and seeds: under 3 minutes on 2 cores."""
        small = dict(seeds=2, pool_size=360, val_size=24, test_size=60, stages=2, steps_per_stage=15,
                     validation_samples=8, projection_dim=512, eval_every=5, eval_samples=4,
                     select_fraction=0.25)
        return cls(**(small | overrides))

    @classmethod
    def make(cls, *, quick: bool = False, **overrides: Any) -> "DemoSettings":
        """The full or quick settings with ``overrides``; bad values raise ``DemoSettingsError``."""
        try:
            return cls.quick(**overrides) if quick else cls(**overrides)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
                                 for err in e.errors())
            raise DemoSettingsError(f"bad demo settings: {problems}") from None

    @property
    def total_steps(self) -> int:
        return self.stages * self.steps_per_stage

    def split_sizes(self) -> dict[str, int]:
        """Prompts per split; each split is a prefix of the task drawn at its full size
        (cropi.demo.assets.TASK_SIZES), which bounds them."""
        from cropi.tasks.skills import TARGETS

        sizes = {"pool": self.pool_size}
        for val, test in TARGETS.values():
            sizes |= {val: self.val_size, test: self.test_size}
        return sizes

    def trainer_options(self, test_files: dict[str, str], method: str = "full",
                        validation_files: dict[str, str] | None = None) -> dict[str, Any]:
        options = {"lr": self.lr, "batch_prompts": self.batch_prompts, "rollouts": self.rollouts,
                   "kl_coef": self.kl_coef, "max_new_tokens": self.max_new_tokens, "eval_files": test_files,
                   "eval_every": self.eval_every, "eval_samples": self.eval_samples}
        if method in ONLINE_METHODS:
            policy = ONLINE_METHODS[method][1]
            online = {"policy": policy, "projection": {"dim": self.projection_dim, "kept_fraction": self.kept_fraction}}
            if policy == "ippo":
                online["validation_files"] = dict(validation_files or {})
            else:
                online["p"] = self.iif_p
            options["online_filter"] = online
        return options
