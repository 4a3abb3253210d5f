"""The demo's settings: the full run and ``--quick``, with every knob in one place."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cropi.errors import InvalidInputError
from cropi.pipeline.curriculum import METHODS


class DemoSettingsError(InvalidInputError):
    """Demo settings that cannot run."""


class DemoSettings(BaseModel):
    """What one ``cropi demo`` run does. The defaults are the full run (see ``quick``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seeds: int = Field(3, ge=1, description="training seeds per method")
    methods: tuple[str, ...] = METHODS
    task_seed: int = Field(0, ge=0, description="seed of the synthetic task's splits")
    pool_size: int = Field(2000, ge=10)
    val_size: int = Field(100, ge=2, description="prompts per validation set (val_a, val_b)")
    test_size: int = Field(200, ge=10)
    stages: int = Field(4, ge=1)
    steps_per_stage: int = Field(10, ge=1)
    select_fraction: float = Field(0.1, gt=0, le=1)
    pool_samples: int = Field(8, ge=2, description="K per pool prompt (CROPI: 8)")
    validation_samples: int = Field(32, ge=2, description="K per validation prompt (CROPI: 32)")
    temperature: float = Field(0.5, gt=0, description="sampling temperature of the offline trajectories")
    max_new_tokens: int = Field(96, gt=0, description="longest response, for collection, training and evaluation")
    projection_dim: int = Field(1024, ge=16)
    kept_fraction: float = Field(0.1, gt=0, le=1)
    lr: float = Field(1e-4, gt=0)
    batch_prompts: int = Field(4, ge=1)
    rollouts: int = Field(8, ge=2)
    kl_coef: float = Field(0.001, ge=0)
    reward: str = "exact_numeric"
    backend: Literal["hf", "vllm"] = "hf"
    workers: int = Field(2, ge=1, description="processes running curricula side by side (one per core)")

    @model_validator(mode="after")
    def _known_methods(self) -> "DemoSettings":
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        if "full" not in self.methods or "cropi" not in self.methods:
            raise ValueError("the demo compares CROPI with full-pool training: keep 'cropi' and 'full' in methods")
        return self

    @classmethod
    def quick(cls, **overrides: Any) -> "DemoSettings":
        """Every method, fewer prompts, stages, steps and seeds: a few minutes on 2 cores."""
        small = dict(seeds=2, pool_size=400, val_size=32, test_size=100, stages=2, steps_per_stage=4,
                     validation_samples=8, projection_dim=512)
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

    def trainer_options(self) -> dict[str, Any]:
        return {"lr": self.lr, "batch_prompts": self.batch_prompts, "rollouts": self.rollouts,
                "kl_coef": self.kl_coef, "max_new_tokens": self.max_new_tokens}
