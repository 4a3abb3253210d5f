"""The curriculum tests' fixed inputs (a tiny random model, a small arithmetic pool, a reward a random
model earns about half the time) and the stand-in trainer that perturbs the weights, so a stage takes
milliseconds and a test can count its calls and make it fail (tests/test_curriculum.py, test_check.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from cropi.data import write_jsonl
from cropi.models import build_tiny_model
from cropi.pipeline.curriculum import CurriculumConfig, loop
from cropi.rewards import register_reward
from cropi.trainers import StageResult

POOL, VAL = 24, 6
FRACTION = 0.25
REWARD = "cropi_test_even_length"


@register_reward(REWARD, replace=True)
def even_length(text: str, answer: str) -> float:
    """A reward a random model earns about half the time, so groups carry signal."""
    return 1.0 if len(text) % 2 == 0 else 0.0


class FakeTrainer:
    """Copies the model with deterministically perturbed weights; records every call."""

    def __init__(self, fail_at_stage: int | None = None):
        self.calls: list[dict] = []
        self.fail_at_stage = fail_at_stage

    def train_stage(self, *, model, subset, out_dir, steps, seed, stage, reward) -> StageResult:
        self.calls.append(dict(model=model, subset=subset, steps=steps, seed=seed, stage=stage, reward=reward))
        if stage == self.fail_at_stage:
            raise RuntimeError(f"simulated crash while training stage {stage}")
        ckpt = Path(out_dir) / "checkpoint"
        shutil.copytree(model, ckpt)
        weights = ckpt / "model.safetensors"
        tensors = load_file(weights)
        g = torch.Generator().manual_seed(1000 + stage)
        save_file({k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                   for k, v in tensors.items()}, weights, metadata={"format": "pt"})
        (Path(out_dir) / "train.log").write_text("fake\n")
        return StageResult(checkpoint=str(ckpt), steps_done=steps, global_step=(stage + 1) * steps, stage=stage,
                           metrics={"reward_mean": 0.5, "loss_last": float("nan")},
                           log_path=str(Path(out_dir) / "train.log"))

    def release(self, checkpoint) -> None:
        """Keeps everything (as the in-process adapters do)."""


def build_setup(base: Path) -> dict:
    """The tiny model, a 24-prompt pool and two validation sets of 6 under ``base``."""
    from cropi.tasks.arithmetic import make_task_splits

    model = build_tiny_model(base / "model", size="tiny", seed=0)
    splits = make_task_splits(7, pool_size=POOL, val_size=VAL, test_size=2)
    files = {}
    for name in ("pool", "val_a", "val_b"):
        files[name] = str(base / f"{name}.jsonl")
        write_jsonl(splits[name], files[name])
    return {"base": base, "model": str(model), "files": files, "root": str(base / "root")}


def make_config(setup, **overrides) -> CurriculumConfig:
    fields = dict(name="cropi-run", model=setup["model"], pool=setup["files"]["pool"],
                  validation={"val_a": setup["files"]["val_a"], "val_b": setup["files"]["val_b"]},
                  stages=2, select_fraction=FRACTION, steps_per_stage=3, method="cropi", trainer="fake", seed=1,
                  reward=REWARD,
                  collect=dict(pool_samples=4, validation_samples=4, temperature=1.0, max_new_tokens=6,
                               backend="hf", batch_prompts=16),
                  projection=dict(kind="sjlt", dim=32, kept_fraction=0.5), gradient_dtype="float32", device="cpu")
    return CurriculumConfig.model_validate(fields | overrides)


def use_trainer(monkeypatch, trainer: FakeTrainer) -> FakeTrainer:
    monkeypatch.setattr(loop, "make_trainer", lambda name, **options: trainer)
    return trainer


