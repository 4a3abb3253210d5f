"""The GPU trainer: one CROPI stage as a (resumed) verl GRPO run, launched and merged here.

The options and the Hydra overrides they become are ``cropi.trainers.verl_overrides`` (pure,
re-exported here); this module runs them: the run folder, the attempt record, the
preflight, the launch, the merge.

verl 0.9 has no curriculum hook, so a stage is a run of
``python -m verl.trainer.main_ppo`` with ``data.train_files`` set to the stage's
parquet, and a checked stage's part (cropi.pipeline.curriculum.parts) is a shorter
run of the same kind. Each call trains in a run folder of its own
(``<out_dir>/../verl_run``): at a fresh start an empty one; from a checkpoint this
adapter wrote, one *branched* from the run state behind it, its ``global_step_S``
hard-linked (no copy) with the tracker at ``S``, and ``resume_mode=auto`` has verl
reload the actor, its optimizer and its global step from there. So any checkpoint
whose run state is kept can be trained on from, again and again: a stage continues
the previous one, and a checked stage restores an earlier part by training on from
it. Steps add up: a call that starts at global step S and trains T steps is
launched with ``total_training_steps = S + T`` and ends at step S + T. The policy's
starting weights come from that state; ``actor_rollout_ref.model.path`` stays the
curriculum's initial model for every call, which also makes it the KL reference,
as in CROPI's single run. ``release`` deletes the run state behind a checkpoint the
curriculum will not train from again (each FSDP state holds the optimizer: several
times the weights), keeping its merged weights. ``VerlOptions.run_dir`` instead
keeps every call in one shared folder, continuing only from its newest step: such a
run cannot restore an earlier part, so its stages run unchecked.

A stage is retried safely: the launcher records the attempt (start, end and
an identity hash of its launch) in the run folder before verl starts. A retry of
the same attempt lets verl resume from whatever it saved (a mid-stage or the final
checkpoint; a final one is only merged again); a retry with other settings rolls
the run folder back to the stage's start. Before any GPU work, verl composes the
launch config (``--cfg job``), so a misspelt override fails in seconds.

After the run, verl's model merger turns ``global_step_{S+T}/actor`` into a
Hugging Face folder (``out_dir/checkpoint``) the next stage's scoring loads.

verl pins an older transformers than vLLM's CPU build, so it usually lives in its
own environment: ``VerlOptions.python`` names that interpreter (cropi must be
installed there too: the reward workers import ``cropi.rewards.verl_reward``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

from cropi.errors import ConflictError, InvalidInputError, MismatchError, NotFoundError
from cropi.trainers.base import StageResult, TrainerAdapter, TrainingFailedError, check_stage_args
from cropi.trainers.lineage import StageMarker, read_marker, write_marker
# the options and their overrides: public here too, where the trainer registry and callers find verl
from cropi.trainers.verl_overrides import (ENTRY_POINT, MERGER, NAME, PYTHON_ENV, REWARD_FUNCTION, RUN_FOLDER,
                                           VERL_DEFAULT_REWARD, VerlOptions, default_run_dir, hydra_value,
                                           merge_command, verl_command, verl_overrides)
from cropi.utils.fsio import atomic_write_bytes, resolve, write_json_atomic

TRACKER = "latest_checkpointed_iteration.txt"  # verl's pointer to its newest global_step_N
ATTEMPT = "cropi_attempt.json"  # the stage attempt the run folder belongs to
# verl metric names summarised into StageResult.metrics.
REWARD_METRIC, LOSS_METRIC, KL_METRIC = "critic/score/mean", "actor/pg_loss", "actor/kl_loss"


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

    @property
    def runs_in_parts(self) -> bool:
        """Each call branches its own run folder from the state behind its checkpoint, so a stage can be trained
        in parts and restored; a shared ``run_dir`` continues only from its newest step."""
        return not self.options.run_dir

    def release(self, checkpoint: str) -> None:
        """Delete the run state behind ``checkpoint`` (its own run folder: FSDP actor and optimizer), keeping the
        merged weights; a shared ``run_dir`` is left alone (later stages continue in it)."""
        if self.options.run_dir:
            return
        marker = read_marker(checkpoint)
        if marker is None or marker.trainer != NAME or not marker.run_state:
            return
        run = Path(marker.run_state)
        if run.name == RUN_FOLDER and (run / ATTEMPT).is_file():  # only a folder this adapter made
            shutil.rmtree(run, ignore_errors=True)

    def train_stage(self, *, model: str, subset: str, out_dir: str, steps: int, seed: int, stage: int,
                    reward: str) -> StageResult:
        check_stage_args(steps=steps, seed=seed, stage=stage)
        opts: VerlOptions = self.options
        _check_reward(reward)
        _check_subset(subset, opts.batch_prompts)
        out = Path(out_dir).expanduser().resolve()
        out.mkdir(parents=True, exist_ok=True)
        run_dir = default_run_dir(opts, out)
        if not opts.run_dir:
            _branch(model, run_dir)
        reference, start = _continuation(model, run_dir, stage)
        end = start + steps
        log_path, metrics_path = out / "verl.log", out / "metrics.jsonl"
        env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics_path), HYDRA_FULL_ERROR="1")
        argv = verl_command(opts, model=reference, subset=subset, val_files=opts.val_files, out_dir=str(out),
                            stage=stage, steps=steps, start_step=start, seed=seed, reward=reward, run_dir=run_dir,
                            attn_implementation=detect_attention(opts.python, env))
        attempt = {"start_step": start, "end_step": end, "identity": _launch_identity(argv, subset)}
        resumed = _resume_or_roll_back(run_dir, attempt, model, stage)
        preflight(argv, env, out)  # a config verl refuses fails here, in seconds, before any GPU work
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(*resolve(str(run_dir / ATTEMPT)), attempt)

        began = time.monotonic()
        if resumed < end:
            if resumed == start:
                _forget_dataloader_position(run_dir, start)
            _run(argv, log_path, env, out, "verl training")
        runtime = time.monotonic() - began
        if latest_step(run_dir) != end:
            raise TrainingFailedError(f"verl stopped at global step {latest_step(run_dir)}, expected {end} "
                                      f"(stage {stage} from step {start}, {steps} steps); see {log_path}")
        checkpoint = _merge(opts.python, run_dir / f"global_step_{end}" / "actor", out, log_path, env)
        write_marker(checkpoint, StageMarker(trainer=NAME, reference_model=reference, stage=stage,
                                             global_step=end, run_state=str(run_dir)))
        # Finished: a later launch from this stage's start is a retry only with these very settings.
        write_json_atomic(*resolve(str(run_dir / ATTEMPT)), attempt | {"done": True})
        _prune(run_dir, keep=opts.max_actor_ckpt_to_keep, newest=end)
        return StageResult(checkpoint=str(checkpoint), steps_done=steps, global_step=end, stage=stage,
                           metrics=summarize_metrics(metrics_path, start, runtime), log_path=str(log_path),
                           metrics_path=str(metrics_path))


def preflight(argv: list[str], env: dict, cwd: Path) -> None:
    """Have verl compose its config from ``argv``'s overrides (``--cfg job``), without running."""
    check = argv[:3] + ["--cfg", "job"] + argv[3:]
    try:
        proc = subprocess.run(check, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    except FileNotFoundError:
        raise NotFoundError(f"cannot run {argv[0]!r}: set VerlOptions.python to the interpreter of the "
                            "environment verl is installed in") from None
    if proc.returncode:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
        raise InvalidInputError(f"verl refused the launch config (nothing was trained); fix the option or "
                                f"extra override it names:\n{tail}")


def detect_attention(python: str, env: dict | None = None) -> str:
    """flash_attention_2 when flash-attn is importable by ``python``, else sdpa."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('flash_attn') is None)"
    try:
        found = subprocess.run([python, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        found = False  # the preflight then says what is wrong with the interpreter
    return "flash_attention_2" if found else "sdpa"


def _launch_identity(argv: list[str], subset: str) -> str:
    """What makes two launches the same attempt: the overrides and the subset's content."""
    h = hashlib.sha256("\0".join(argv[1:]).encode())
    h.update(Path(subset).read_bytes())
    return h.hexdigest()[:16]


def _resume_or_roll_back(run_dir: Path, attempt: dict, model: str, stage: int) -> int:
    """The step verl will resume this stage from, after clearing what an unfinished attempt left.

    ``_continuation`` made sure the run folder is at the stage's start, or past it
    through an attempt that started there.
    """
    start, latest = attempt["start_step"], latest_step(run_dir)
    if latest == start:
        return start
    previous = _read_attempt(run_dir) or {}
    if {k: v for k, v in previous.items() if k != "done"} == attempt:
        return latest  # the same launch again: verl resumes from its own newest checkpoint
    if previous.get("done"):
        raise _moved_on(model, run_dir, start, latest, stage)
    if start and not (run_dir / f"global_step_{start}" / "actor").is_dir():
        raise ConflictError(f"stage {stage} was started in {run_dir} with other settings and its starting "
                            f"checkpoint global_step_{start} is gone: retry with the settings of that attempt, "
                            "or start a new run")
    for step, folder in _steps(run_dir):
        if step > start:
            shutil.rmtree(folder)
    tracker = run_dir / TRACKER
    if start:
        atomic_write_bytes(*resolve(str(tracker)), str(start).encode())
    else:
        tracker.unlink(missing_ok=True)
    return start


def _read_attempt(run_dir: Path) -> Optional[dict]:
    path = run_dir / ATTEMPT
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None  # a torn record matches no attempt: the stage is rolled back and run again


def _steps(run_dir: Path) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), p) for p in run_dir.glob("global_step_*")
             if (m := re.fullmatch(r"global_step_(\d+)", p.name)) and p.is_dir()]
    return sorted(found)


def _prune(run_dir: Path, *, keep: int, newest: int) -> None:
    """Delete all but the ``keep`` newest checkpoints up to ``newest`` (a finished stage's end)."""
    kept = [s for s, _ in _steps(run_dir) if s <= newest][-keep:]
    for step, folder in _steps(run_dir):
        if step < newest and step not in kept:
            shutil.rmtree(folder)


def _merge(python: str, actor: Path, out: Path, log_path: Path, env: dict) -> Path:
    """verl's merger into ``out/checkpoint``, through a scratch folder so a torn merge is never used."""
    checkpoint, scratch = out / "checkpoint", out / "checkpoint.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    _run(merge_command(python, actor, scratch), log_path, env, out, "verl model merger", append=True)
    if not any(scratch.glob("*.safetensors")):
        raise TrainingFailedError(f"the model merger wrote no weights into {scratch}; see {log_path}")
    shutil.rmtree(checkpoint, ignore_errors=True)
    scratch.rename(checkpoint)
    return checkpoint


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


def _branch(model: str, run_dir: Path) -> None:
    """Seed this call's own run folder from the run state behind ``model`` (a checkpoint this adapter wrote):
    its ``global_step_S`` hard-linked (verl writes new step folders and never rewrites a loaded one, and an
    unlink here leaves the parent's file) and the tracker at ``S``. Built under a scratch name and renamed, so
    a kill leaves either no folder or a whole one; a folder already there is this call's retry."""
    marker = read_marker(model)
    if run_dir.exists() or marker is None or marker.trainer != NAME or not marker.run_state:
        return  # a retry, a fresh start, or another trainer's checkpoint (_continuation says what is wrong)
    parent, step = Path(marker.run_state), marker.global_step
    source = parent / f"global_step_{step}"
    if not source.is_dir():
        raise ConflictError(f"the run state behind {model} ({source}) is gone: it was released once its "
                            "curriculum moved past it, or pruned. Train on from a checkpoint whose state is kept "
                            "(the curriculum's last), or start from the initial model")
    scratch = run_dir.with_name(run_dir.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(source, scratch / source.name, copy_function=_link_or_copy)
    (scratch / TRACKER).write_text(str(step))
    scratch.rename(run_dir)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)


def _continuation(model: str, run_dir: Path, stage: int) -> tuple[str, int]:
    """(the run's initial model, the global step this stage starts at), checked against the run folder.

    The run folder may be past the start only through an attempt of this stage
    (a retry after verl saved, or after the merge): its attempt record starts there.
    """
    marker = read_marker(model)
    latest = latest_step(run_dir)
    if marker is not None and marker.trainer != NAME:
        raise ConflictError(f"{model} was trained by {marker.trainer!r}; a verl run resumes only its own "
                            "checkpoints. Start a new curriculum with the verl trainer from the initial model")
    start = marker.global_step if marker else 0
    reference = marker.reference_model if marker else str(Path(model).resolve())
    attempt = _read_attempt(run_dir)
    retry = attempt is not None and attempt.get("start_step") == start and latest <= attempt.get("end_step", -1)
    if latest == start or (latest > start and retry):
        return reference, start
    raise _moved_on(model, run_dir, start, latest, stage)


def _moved_on(model: str, run_dir: Path, start: int, latest: int, stage: int) -> Exception:
    if not start:
        return ConflictError(f"{run_dir} already holds a verl run at global step {latest}, but {model} is not "
                             "one of its stage checkpoints: pass the previous stage's checkpoint, or use a "
                             "new run_dir to start a new run")
    return MismatchError(f"{model} is from global step {start} but {run_dir} is at step {latest}: stage "
                         f"{stage} must continue from the run's newest checkpoint")


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
           "preflight", "detect_attention", "latest_step", "default_run_dir", "summarize_metrics", "ENTRY_POINT",
           "MERGER", "NAME", "PYTHON_ENV", "REWARD_FUNCTION", "VERL_DEFAULT_REWARD"]
