"""The GPU trainer: one CROPI stage as a (resumed) verl GRPO run.

verl 0.9 has no curriculum hook, so a stage is a run of
``python -m verl.trainer.main_ppo`` with ``data.train_files`` set to the stage's
parquet. Every stage of a curriculum uses the same ``trainer.default_local_dir``
(the run folder) and ``resume_mode=auto``: verl reloads the actor, its optimizer
and its global step from the newest ``global_step_N`` there, so the stages are one
run. Steps add up: a stage that starts at global step S and trains T steps is
launched with ``total_training_steps = S + T`` and ends at step S + T, the sum
of the steps of all stages so far. The policy's starting weights come from that
checkpoint; ``actor_rollout_ref.model.path`` stays the curriculum's initial model
for every stage, which also makes it the KL reference, as in CROPI's single run.

After the run, verl's model merger turns ``global_step_{S+T}/actor`` into a
Hugging Face folder (``out_dir/checkpoint``) the next stage's scoring loads.

verl pins an older transformers than vLLM's CPU build, so it usually lives in its
own environment: ``VerlOptions.python`` names that interpreter (cropi must be
installed there too: the reward workers import ``cropi.rewards.verl_reward``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from cropi.errors import ConflictError, InvalidInputError, MismatchError, NotFoundError
from cropi.trainers.base import (GrpoOptions, StageResult, TrainerAdapter, TrainingFailedError,
                                 check_stage_args)
from cropi.trainers.lineage import StageMarker, read_marker, write_marker

NAME = "verl"
ENTRY_POINT = "verl.trainer.main_ppo"
MERGER = "verl.model_merger"
# The reward name that keeps verl's own scorer (chosen by each row's data_source).
VERL_DEFAULT_REWARD = "verl_default"
TRACKER = "latest_checkpointed_iteration.txt"  # verl's pointer to its newest global_step_N
REWARD_FILE = Path(__file__).parents[1] / "rewards" / "verl_reward.py"
# verl metric names summarised into StageResult.metrics.
REWARD_METRIC, LOSS_METRIC, KL_METRIC = "critic/score/mean", "actor/pg_loss", "actor/kl_loss"
_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
PYTHON_ENV = "CROPI_VERL_PYTHON"  # default interpreter of the verl environment


class VerlOptions(GrpoOptions):
    """verl GRPO settings; the defaults are CROPI's (lr 1e-6, 128 prompts, n=8, KL loss 0.001).

    ``mini_batch_prompts``: prompts per actor update (default: the whole batch, so
    one update per step, fully on-policy). ``micro_batch_per_gpu``: sequences per
    forward pass on a GPU (actor, reference and rollout log-probs). ``save_freq``:
    extra checkpoints every so many global steps; the end of a stage is always saved.
    ``run_dir``: the run's ``trainer.default_local_dir``, shared by all stages
    (default: ``<out_dir>/../verl_run``). ``python``: the interpreter of the verl
    environment (default: ``$CROPI_VERL_PYTHON``, else ``python``). ``val_files``: the
    parquet verl validates on when ``test_freq`` asks. ``extra_overrides``: more ``key=value`` Hydra overrides, last wins.
    """

    max_new_tokens: int = Field(2048, gt=0)
    kl_loss_type: Literal["kl", "abs", "mse", "low_var_kl", "full"] = "low_var_kl"
    entropy_coeff: float = Field(0.0, ge=0)
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
    val_files: Optional[str] = Field(None, description="validation parquet (default: the stage subset)")
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
        return self


def default_run_dir(options: VerlOptions, out_dir: str | Path) -> Path:
    """The run folder shared by all stages: ``options.run_dir`` or ``<out_dir>/../verl_run``."""
    return Path(options.run_dir) if options.run_dir else Path(out_dir).resolve().parent / "verl_run"


def verl_overrides(options: VerlOptions, *, model: str, subset: str, val_files: Optional[str], out_dir: str,
                   stage: int, steps: int, start_step: int = 0, seed: int = 0,
                   reward: str = "math_verify") -> dict[str, Any]:
    """The Hydra overrides of one stage, key to value, in launch order.

    ``model``: the curriculum's initial model (policy init at step 0 and KL
    reference throughout). ``start_step``: the run's global step when the stage
    begins. ``stage`` names nothing in verl; it is accepted for symmetry with
    ``train_stage`` and for error messages.
    """
    check_stage_args(steps=steps, seed=seed, stage=stage)
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise InvalidInputError(f"start_step must be an integer >= 0, got {start_step!r}")
    end = start_step + steps
    micro = options.micro_batch_per_gpu
    o: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_files": _abs(subset),
        "data.val_files": _abs(val_files or subset),
        "data.train_batch_size": options.batch_prompts,
        "data.max_prompt_length": options.max_prompt_tokens,
        "data.max_response_length": options.max_new_tokens,
        "data.seed": seed,
        "actor_rollout_ref.model.path": _abs(model),
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
        "trainer.default_local_dir": str(default_run_dir(options, out_dir).resolve()),
        "trainer.project_name": options.project_name,
        "trainer.experiment_name": options.experiment_name,
        "trainer.logger": list(options.loggers),
    }
    if reward != VERL_DEFAULT_REWARD:
        o["reward.custom_reward_function.path"] = str(REWARD_FILE.resolve())
        o["reward.custom_reward_function.name"] = "compute_score"
        # reward_kwargs is read by verl but absent from its config schema: "+" adds the key.
        o["+reward.custom_reward_function.reward_kwargs.reward_name"] = reward
    for extra in options.extra_overrides:
        key, value = extra.split("=", 1)
        o[key] = _Raw(value)
    return o


def verl_command(options: VerlOptions, *, model: str, subset: str, val_files: Optional[str], out_dir: str,
                 stage: int, steps: int, start_step: int = 0, seed: int = 0,
                 reward: str = "math_verify") -> list[str]:
    """``[python, -m, verl.trainer.main_ppo, key=value, ...]`` for one stage (see ``verl_overrides``)."""
    overrides = verl_overrides(options, model=model, subset=subset, val_files=val_files, out_dir=out_dir,
                               stage=stage, steps=steps, start_step=start_step, seed=seed, reward=reward)
    return [options.python, "-m", ENTRY_POINT] + [f"{k}={hydra_value(v)}" for k, v in overrides.items()]


def merge_command(python: str, actor_dir: str | Path, target_dir: str | Path) -> list[str]:
    """verl's FSDP checkpoint to Hugging Face conversion (``python -m verl.model_merger merge``)."""
    return [python, "-m", MERGER, "merge", "--backend", "fsdp", "--local_dir", str(actor_dir),
            "--target_dir", str(target_dir)]


class _Raw(str):
    """A user-given override value, passed to Hydra exactly as written."""


_PLAIN = re.compile(r"[A-Za-z0-9_./~:+@-]+")


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


def latest_step(run_dir: str | Path) -> int:
    """The global step of the newest checkpoint verl recorded in ``run_dir`` (0 when none)."""
    tracker = Path(run_dir) / TRACKER
    if not tracker.is_file():
        return 0
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise InvalidInputError(f"{tracker} should hold a step number, has {text[:40]!r}: "
                                "restore it or start a new run_dir")
    return int(text)


class VerlTrainer(TrainerAdapter):
    """Train a stage by launching verl in a subprocess, then merge its actor into a HF folder."""

    name = NAME
    options_model = VerlOptions

    def train_stage(self, *, model: str, subset: str, out_dir: str, steps: int, seed: int, stage: int,
                    reward: str) -> StageResult:
        check_stage_args(steps=steps, seed=seed, stage=stage)
        opts: VerlOptions = self.options
        _check_reward(reward)
        _check_subset(subset, opts.batch_prompts)
        out = Path(out_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        run_dir = default_run_dir(opts, out).resolve()
        reference, start = _continuation(model, run_dir, stage)
        _forget_dataloader_position(run_dir, start)

        argv = verl_command(opts, model=reference, subset=subset, val_files=opts.val_files, out_dir=str(out),
                            stage=stage, steps=steps, start_step=start, seed=seed, reward=reward)
        log_path, metrics_path = out / "verl.log", out / "metrics.jsonl"
        env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics_path), HYDRA_FULL_ERROR="1")
        began = time.monotonic()
        _run(argv, log_path, env, out, "verl training")
        runtime = time.monotonic() - began

        end = latest_step(run_dir)
        if end != start + steps:
            raise TrainingFailedError(f"verl stopped at global step {end}, expected {start + steps} "
                                      f"(stage {stage} from step {start}, {steps} steps); see {log_path}")
        checkpoint = out / "checkpoint"
        _run(merge_command(opts.python, run_dir / f"global_step_{end}" / "actor", checkpoint),
             log_path, env, out, "verl model merger", append=True)
        if not any(checkpoint.glob("*.safetensors")):
            raise TrainingFailedError(f"the model merger wrote no weights into {checkpoint}; see {log_path}")
        write_marker(checkpoint, StageMarker(trainer=NAME, reference_model=reference, stage=stage,
                                             global_step=end, run_state=str(run_dir)))
        return StageResult(checkpoint=str(checkpoint), steps_done=end - start, global_step=end, stage=stage,
                           metrics=summarize_metrics(metrics_path, start, runtime), log_path=str(log_path),
                           metrics_path=str(metrics_path))


def _check_reward(reward: str) -> None:
    if reward == VERL_DEFAULT_REWARD:
        return
    from cropi.rewards import get_reward

    get_reward(reward)  # an unknown name fails here, not inside verl's reward workers


def _check_subset(subset: str, batch_prompts: int) -> None:
    import pyarrow.parquet as pq

    path = Path(subset)
    if not path.is_file():
        raise NotFoundError(f"stage subset {subset} does not exist: pass the verl parquet the selector wrote")
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a file that is not parquet
        raise InvalidInputError(f"stage subset {subset} is not a readable parquet file ({e}): pass the verl "
                                "parquet the selector wrote") from None
    if rows < batch_prompts:
        # verl would compute zero steps per epoch and fail far from the cause.
        raise InvalidInputError(f"{subset} has {rows} prompts but a step takes batch_prompts={batch_prompts}: "
                                "lower batch_prompts or select more prompts")


def _continuation(model: str, run_dir: Path, stage: int) -> tuple[str, int]:
    """(the run's initial model, the global step this stage starts at), checked against the run folder."""
    marker = read_marker(model)
    start = latest_step(run_dir)
    if marker is None:
        if start:
            raise ConflictError(f"{run_dir} already holds a verl run at global step {start}, but {model} is not "
                                "one of its stage checkpoints: pass the previous stage's checkpoint, or use a "
                                "new run_dir to start a new run")
        return str(Path(model).resolve()), 0
    if marker.trainer != NAME:
        raise ConflictError(f"{model} was trained by {marker.trainer!r}; a verl run resumes only its own "
                            "checkpoints. Start a new curriculum with the verl trainer from the initial model")
    if marker.global_step != start:
        raise MismatchError(f"{model} is from global step {marker.global_step} but {run_dir} is at step "
                            f"{start}: stage {stage} must continue from the run's newest checkpoint")
    return marker.reference_model, start


def _forget_dataloader_position(run_dir: Path, step: int) -> None:
    """Drop the saved sampler position at a stage boundary.

    verl would restore it into the next stage's dataloader, which reads a
    different parquet; without it the new subset starts a fresh shuffle.
    """
    if step:
        (run_dir / f"global_step_{step}" / "data.pt").unlink(missing_ok=True)


def _run(argv: list[str], log_path: Path, env: dict, cwd: Path, what: str, append: bool = False) -> None:
    with log_path.open("a" if append else "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        try:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd).returncode
        except FileNotFoundError:
            raise NotFoundError(f"cannot run {argv[0]!r} for {what}: set VerlOptions.python to the "
                                "interpreter of the environment verl is installed in") from None
    if rc:
        raise TrainingFailedError(f"{what} exited with status {rc}; last lines of {log_path}:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def summarize_metrics(path: str | Path, start_step: int, runtime: float) -> dict[str, float]:
    """Stage summary from verl's file logger (``{"step": N, "data": {...}}`` a line)."""
    rows = []
    p = Path(path)
    if p.is_file():
        for line in p.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row.get("step", 0) > start_step:
                    rows.append(row.get("data", {}))
    summary = {"runtime_s": runtime, "steps_logged": float(len(rows))}
    rewards = [float(r[REWARD_METRIC]) for r in rows if REWARD_METRIC in r]
    if rewards:
        summary |= {"reward_mean": sum(rewards) / len(rewards), "reward_last": rewards[-1],
                    "reward_first": rewards[0]}
    for key, name in ((LOSS_METRIC, "loss_last"), (KL_METRIC, "kl_last")):
        values = [float(r[key]) for r in rows if key in r]
        if values:
            summary[name] = values[-1]
    return summary


__all__ = ["VerlOptions", "VerlTrainer", "verl_command", "verl_overrides", "merge_command", "hydra_value",
           "latest_step", "default_run_dir", "summarize_metrics", "VERL_DEFAULT_REWARD"]
