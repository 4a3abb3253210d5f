"""The trainer-adapter contract: train one curriculum stage, hand back a checkpoint.

A CROPI curriculum alternates scoring and training. The training half is a
``TrainerAdapter``: given the current checkpoint (a Hugging Face folder) and the
stage's prompts (a verl RLVR parquet), it runs GRPO for a number of steps and
returns a new Hugging Face folder the next stage can score. The stages of one
curriculum are one continuing run: the same reference model, the optimizer state
carried where the trainer can, and global steps that add up across stages.

Adapters are made by name with ``make_trainer("trl", lr=1e-5)``; each has a pydantic
options model, so a bad setting fails before any work starts.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cropi.errors import InvalidInputError, NotFoundError, format_validation_error


class TrainerOptionsError(InvalidInputError):
    """Trainer options that cannot work (a wrong type, a batch that does not divide)."""


class UnknownTrainerError(NotFoundError):
    """No trainer adapter is known under the requested name."""


class TrainingFailedError(InvalidInputError):
    """The trainer ran but did not produce a usable checkpoint."""

    code = "training_failed"
    http_status = 500


class GrpoOptions(BaseModel):
    """GRPO settings every adapter shares; adapters extend it with their own.

    ``batch_prompts`` prompts per optimizer step, ``rollouts`` responses sampled per
    prompt (the GRPO group), ``kl_coef`` the weight of the KL loss to the run's
    reference model (the curriculum's initial model).
    """

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-6, gt=0, description="learning rate (constant schedule)")
    batch_prompts: int = Field(128, gt=0, description="prompts per optimizer step")
    rollouts: int = Field(8, ge=2, description="responses per prompt; GRPO needs at least 2")
    kl_coef: float = Field(0.001, ge=0, description="KL loss coefficient (0 turns the reference model off)")
    max_prompt_tokens: int = Field(1024, gt=0)
    max_new_tokens: int = Field(1024, gt=0, description="longest sampled response")
    temperature: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)


class StageResult(BaseModel):
    """What one trained stage produced."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(description="Hugging Face folder (model + tokenizer) of the trained policy")
    steps_done: int = Field(ge=0, description="optimizer steps taken in this stage")
    global_step: int = Field(ge=0, description="optimizer steps of the whole run at the end of this stage")
    stage: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict,
                                      description="stage summary: reward_mean, reward_last, loss_last, runtime_s, ...")
    log_path: str = Field(description="the trainer's log of this stage")
    metrics_path: Optional[str] = Field(None, description="per-step metrics, one JSON object a line")


class TrainerAdapter(ABC):
    """Train one curriculum stage with GRPO. Subclasses set ``name`` and ``options_model``."""

    name: ClassVar[str]
    options_model: ClassVar[type[GrpoOptions]] = GrpoOptions
    # Whether ``train_stage`` may be called for part of a stage from any checkpoint of the run it saved (a
    # checked stage trains in parts and restores by training on from an earlier part's checkpoint).
    runs_in_parts: ClassVar[bool] = True

    def __init__(self, options: Optional[GrpoOptions] = None, **overrides: Any):
        if options is not None and overrides:
            raise TrainerOptionsError("pass either an options object or keyword options, not both")
        if options is None:
            options = parse_options(self.options_model, overrides, self.name)
        elif not isinstance(options, self.options_model):
            raise TrainerOptionsError(f"trainer {self.name!r} takes {self.options_model.__name__}, "
                                      f"got {type(options).__name__}")
        self.options = options

    @abstractmethod
    def train_stage(self, *, model: str, subset: str, out_dir: str, steps: int, seed: int, stage: int,
                    reward: str) -> StageResult:
        """Train ``model`` on the prompts of ``subset`` for ``steps`` optimizer steps.

        ``model``: the current checkpoint (the initial model at stage 0, then the
        previous stage's ``StageResult.checkpoint``). ``subset``: verl RLVR parquet.
        ``reward``: a ``cropi.rewards`` name. Writes everything under ``out_dir``.
        """

    def release(self, checkpoint: str) -> None:
        """The curriculum will not train on from ``checkpoint`` again: an adapter whose run state behind a
        checkpoint is large (verl's FSDP actor and optimizer) may delete it; the weights stay. The in-process
        adapters keep their AdamW state (``trainer_state/``, the size of the weights twice over) so a finished
        curriculum's checkpoints can still be trained on."""


def parse_options(model: type[BaseModel], values: dict[str, Any], trainer: str) -> Any:
    """``model(**values)``, with pydantic's errors turned into one readable ``TrainerOptionsError``."""
    try:
        return model(**values)
    except ValidationError as e:
        problems = format_validation_error(e, "options")
        raise TrainerOptionsError(f"bad options for trainer {trainer!r}: {problems}") from None


def check_stage_args(*, steps: int, seed: int, stage: int) -> None:
    """The integer arguments of ``train_stage`` every adapter checks the same way."""
    for name, value, low in (("steps", steps, 1), ("seed", seed, 0), ("stage", stage, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidInputError(f"{name} must be an integer >= {low}, got {value!r}")


# Adapters are imported on first use: trl lives only in the main environment and
# verl's launcher must import where trl is absent (the verl environment).
_ADAPTERS = {
    "lean": ("cropi.trainers.lean", "LeanTrainer"),
    "trl": ("cropi.trainers.trl", "TrlTrainer"),
    "verl": ("cropi.trainers.verl", "VerlTrainer"),
}


def available_trainers() -> list[str]:
    """Trainer names ``make_trainer`` accepts."""
    return sorted(_ADAPTERS)


def trainer_class(name: str) -> type[TrainerAdapter]:
    """The adapter class registered under ``name``."""
    if name not in _ADAPTERS:
        raise UnknownTrainerError(f"unknown trainer {name!r}; available: {', '.join(available_trainers())}")
    module, attr = _ADAPTERS[name]
    return getattr(importlib.import_module(module), attr)


def make_trainer(name: str, **options: Any) -> TrainerAdapter:
    """A trainer adapter by name, its options checked: ``make_trainer("verl", n_gpus_per_node=4)``."""
    return trainer_class(name)(**options)

