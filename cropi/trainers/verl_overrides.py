"""verl's side of a stage as data: the options, and the Hydra overrides and commands they become.

Pure: ``verl_overrides`` maps a ``VerlOptions`` and one stage's inputs to the overrides of
``python -m verl.trainer.main_ppo`` (key to value, in launch order), ``hydra_value`` renders each,
and ``verl_command`` / ``merge_command`` are the argv lists. Nothing here starts a process; the
launcher that runs them, resumes the run folder and merges the actor is ``cropi.trainers.verl``.

Steps add up: a stage that starts at global step S and trains T steps is launched with
``total_training_steps = S + T``. ``actor_rollout_ref.model.path`` stays the curriculum's initial
model for every stage, which also makes it the KL reference, as in CROPI's single run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from cropi.errors import InvalidInputError
from cropi.trainers.base import GrpoOptions, check_stage_args

NAME = "verl"
ENTRY_POINT = "verl.trainer.main_ppo"
MERGER = "verl.model_merger"
# The reward name that keeps verl's own scorer (chosen by each row's data_source).
VERL_DEFAULT_REWARD = "verl_default"
REWARD_FUNCTION = "pkg://cropi.rewards.verl_reward"  # importable wherever cropi is installed
_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
RUN_FOLDER = "verl_run"  # a call's own run folder, next to its out_dir
PYTHON_ENV = "CROPI_VERL_PYTHON"  # default interpreter of the verl environment


class VerlOptions(GrpoOptions):
    """verl GRPO settings; the defaults are CROPI's (lr 1e-6, 128 prompts, n=8, KL loss 0.001).

    ``mini_batch_prompts``: prompts per actor update (default: the whole batch, so
    one update per step, fully on-policy). ``micro_batch_per_gpu``: sequences per
    forward pass on a GPU (actor, reference and rollout log-probs). ``save_freq``:
    extra checkpoints every so many global steps; the end of a stage is always saved.
    ``run_dir``: one ``trainer.default_local_dir`` shared by every stage, each
    continuing from its newest step (so the stages run unchecked); default: each
    call's own ``<out_dir>/../verl_run``, branched from the run state behind its
    input checkpoint, which lets a checked stage restore an earlier part. ``python``: the interpreter of the verl
    environment (default: ``$CROPI_VERL_PYTHON``, else ``python``). ``val_files``: the
    parquet verl validates on; required when ``test_freq`` or ``val_before_train``
    asks for validation (verl loads ``data.val_files`` regardless, so without
    validation the stage subset stands in, unread beyond loading).
    ``attn_implementation``: the actor's attention (default: flash_attention_2 when
    flash-attn is importable in the verl environment, else sdpa).
    ``max_actor_ckpt_to_keep``: FSDP checkpoints kept in the run folder; older
    ones are deleted once a call is merged (its end is always kept). ``ray_address``: the Ray cluster verl
    joins (default: ``auto`` when ``nnodes > 1``, a cluster started with ``ray
    start`` on every node; else verl starts its own). ``extra_overrides``: more
    ``key=value`` Hydra overrides, last wins.
    """

    max_prompt_tokens: int = Field(2048, gt=0)
    max_new_tokens: int = Field(2048, gt=0)
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl", "full"] = "low_var_kl"
    entropy_coeff: float = Field(0.001, ge=0)
    rollout_name: Literal["vllm", "sglang"] = "vllm"
    mini_batch_prompts: Optional[int] = Field(None, gt=0)
    micro_batch_per_gpu: int = Field(8, gt=0)
    n_gpus_per_node: int = Field(8, gt=0)
    nnodes: int = Field(1, gt=0)
    tensor_parallel: int = Field(1, gt=0, description="rollout tensor-parallel size")
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    save_freq: Optional[int] = Field(None, gt=0)
    test_freq: int = Field(-1, ge=-1)
    val_before_train: bool = False
    project_name: str = Field("cropi", pattern=_NAME_PATTERN)
    experiment_name: str = Field("cropi-curriculum", pattern=_NAME_PATTERN)
    run_dir: Optional[str] = None
    python: str = Field(default_factory=lambda: os.environ.get(PYTHON_ENV, "python"), min_length=1)
    val_files: Optional[str] = Field(None, description="validation parquet (needed when validation is asked)")
    attn_implementation: Optional[Literal["flash_attention_2", "sdpa", "eager"]] = None
    max_actor_ckpt_to_keep: int = Field(1, gt=0)
    ray_address: Optional[str] = Field(None, min_length=1)
    loggers: list[Literal["console", "file", "wandb", "tensorboard", "mlflow", "swanlab"]] = ["console", "file"]
    extra_overrides: list[str] = Field(default_factory=list)

    @field_validator("extra_overrides")
    @classmethod
    def _key_value(cls, v: list[str]) -> list[str]:
        bad = [o for o in v if "=" not in o or o.startswith("=")]
        if bad:
            raise ValueError(f"each extra override must be key=value, got {bad}")
        return v

    @model_validator(mode="after")
    def _batches_divide(self) -> "VerlOptions":
        mini = self.mini_batch_prompts or self.batch_prompts
        gpus = self.n_gpus_per_node * self.nnodes
        if mini > self.batch_prompts or self.batch_prompts % mini:
            raise ValueError(f"mini_batch_prompts {mini} must divide batch_prompts {self.batch_prompts}")
        if (self.batch_prompts * self.rollouts) % gpus:
            raise ValueError(f"batch_prompts * rollouts = {self.batch_prompts * self.rollouts} must divide "
                             f"evenly over the {gpus} GPUs (n_gpus_per_node * nnodes)")
        if self.n_gpus_per_node % self.tensor_parallel:
            raise ValueError(f"tensor_parallel {self.tensor_parallel} must divide n_gpus_per_node "
                             f"{self.n_gpus_per_node}")
        if (self.test_freq > 0 or self.val_before_train) and not self.val_files:
            raise ValueError("validation is asked (test_freq > 0 or val_before_train) but val_files is not set: "
                             "pass a validation parquet, not the stage's training subset")
        return self

    @property
    def cluster_address(self) -> Optional[str]:
        return self.ray_address or ("auto" if self.nnodes > 1 else None)


def default_run_dir(options: VerlOptions, out_dir: str | Path) -> Path:
    """The run folder of one call: ``options.run_dir`` if set (one folder shared by every call, continuing
    from its newest step), else the call's own ``<out_dir>/../verl_run``, a folder a retry of the call finds
    again (cropi.trainers.verl branches it from the run state behind the input checkpoint)."""
    if options.run_dir:
        return Path(options.run_dir).expanduser().resolve()
    return Path(out_dir).expanduser().resolve().parent / RUN_FOLDER


def verl_overrides(options: VerlOptions, *, model: str, subset: str, val_files: Optional[str], out_dir: str,
                   stage: int, steps: int, start_step: int = 0, seed: int = 0,
                   reward: str = "math_verify", run_dir: str | Path | None = None,
                   attn_implementation: Optional[str] = None) -> dict[str, Any]:
    """The Hydra overrides of one stage, key to value, in launch order.

    ``model``: the curriculum's initial model (policy init at step 0 and KL
    reference throughout). ``start_step``: the run's global step when the stage
    begins. ``stage`` names nothing in verl; it is accepted for symmetry with
    ``train_stage`` and for error messages. ``run_dir``: the run folder (default:
    ``default_run_dir``). ``attn_implementation``: when ``options`` leaves it open,
    the one detected in the verl environment (default sdpa).
    """
    check_stage_args(steps=steps, seed=seed, stage=stage)
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise InvalidInputError(f"start_step must be an integer >= 0, got {start_step!r}")
    end = start_step + steps
    micro = options.micro_batch_per_gpu
    attention = options.attn_implementation or attn_implementation or "sdpa"
    run = Path(run_dir).expanduser().resolve() if run_dir else default_run_dir(options, out_dir)
    o: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_files": _abs(subset),
        # verl loads data.val_files even when it never validates: the subset stands in then.
        "data.val_files": _abs(val_files or subset),
        "data.filter_overlong_prompts": True,  # dropped, not silently left-truncated
        "data.train_batch_size": options.batch_prompts,
        "data.max_prompt_length": options.max_prompt_tokens,
        "data.max_response_length": options.max_new_tokens,
        "data.seed": seed,
        "actor_rollout_ref.model.path": _abs(model),
        # verl's default is flash_attention_2, which fails at start without flash-attn.
        "+actor_rollout_ref.model.override_config.attn_implementation": attention,
        # Packed sequences (remove padding) rely on flash-attn's varlen kernels to keep them apart.
        "actor_rollout_ref.model.use_remove_padding": attention == "flash_attention_2",
        "actor_rollout_ref.actor.optim.lr": options.lr,
        "actor_rollout_ref.actor.optim.weight_decay": options.weight_decay,
        "actor_rollout_ref.actor.optim.clip_grad": options.grad_clip,
        "actor_rollout_ref.actor.ppo_mini_batch_size": options.mini_batch_prompts or options.batch_prompts,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.use_kl_loss": options.kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": options.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": options.kl_loss_type,
        "actor_rollout_ref.actor.entropy_coeff": options.entropy_coeff,
        "actor_rollout_ref.actor.data_loader_seed": seed,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.name": options.rollout_name,
        "actor_rollout_ref.rollout.n": options.rollouts,
        "actor_rollout_ref.rollout.temperature": options.temperature,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": options.tensor_parallel,
        "actor_rollout_ref.rollout.gpu_memory_utilization": options.gpu_memory_utilization,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.seed": seed,
        "trainer.n_gpus_per_node": options.n_gpus_per_node,
        "trainer.nnodes": options.nnodes,
        "trainer.total_training_steps": end,
        # verl also stops at total_epochs; with cumulative global steps and a small
        # subset the epoch count can pass its default (30) first. At least one step
        # per epoch, so `end` epochs never stop a run before `end` steps.
        "trainer.total_epochs": end,
        # Saving at `end` (and at is_last_step) guarantees the stage's final checkpoint.
        "trainer.save_freq": options.save_freq or end,
        "trainer.test_freq": options.test_freq,
        "trainer.val_before_train": options.val_before_train,
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": str(run),
        "trainer.max_actor_ckpt_to_keep": options.max_actor_ckpt_to_keep,
        "trainer.project_name": options.project_name,
        "trainer.experiment_name": options.experiment_name,
        "trainer.logger": list(options.loggers),
    }
    if reward != VERL_DEFAULT_REWARD:
        o["reward.custom_reward_function.path"] = REWARD_FUNCTION
        o["reward.custom_reward_function.name"] = "compute_score"
        # reward_kwargs is read by verl but absent from its config schema: "+" adds the key.
        o["+reward.custom_reward_function.reward_kwargs.reward_name"] = reward
    if options.cluster_address:
        o["+ray_kwargs.ray_init.address"] = options.cluster_address
    for extra in options.extra_overrides:
        key, value = extra.split("=", 1)
        o[key] = _Raw(value)
    return o


def verl_command(options: VerlOptions, *, model: str, subset: str, val_files: Optional[str], out_dir: str,
                 stage: int, steps: int, start_step: int = 0, seed: int = 0,
                 reward: str = "math_verify", run_dir: str | Path | None = None,
                 attn_implementation: Optional[str] = None) -> list[str]:
    """``[python, -m, verl.trainer.main_ppo, key=value, ...]`` for one stage (see ``verl_overrides``)."""
    overrides = verl_overrides(options, model=model, subset=subset, val_files=val_files, out_dir=out_dir,
                               stage=stage, steps=steps, start_step=start_step, seed=seed, reward=reward,
                               run_dir=run_dir, attn_implementation=attn_implementation)
    return [options.python, "-m", ENTRY_POINT] + [f"{k}={hydra_value(v)}" for k, v in overrides.items()]


def merge_command(python: str, actor_dir: str | Path, target_dir: str | Path) -> list[str]:
    """verl's FSDP checkpoint to Hugging Face conversion (``python -m verl.model_merger merge``)."""
    return [python, "-m", MERGER, "merge", "--backend", "fsdp", "--local_dir", str(actor_dir),
            "--target_dir", str(target_dir)]


class _Raw(str):
    """A user-given override value, passed to Hydra exactly as written."""


# Left unquoted only when Hydra reads it back as the same string: no "~" (Hydra's
# grammar refuses it unquoted), no leading digit (it would become a number).
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:+@-]*")


def hydra_value(v: Any) -> str:
    """A Python value as Hydra override syntax: booleans, null, numbers, lists, quoted odd strings."""
    if isinstance(v, _Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    s = str(v)
    if _PLAIN.fullmatch(s) and s not in ("true", "false", "null"):
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _abs(path: str) -> str:
    return str(Path(path).expanduser().resolve())


__all__ = ["ENTRY_POINT", "MERGER", "NAME", "PYTHON_ENV", "REWARD_FUNCTION", "VERL_DEFAULT_REWARD", "VerlOptions",
           "default_run_dir", "hydra_value", "merge_command", "verl_command", "verl_overrides"]
