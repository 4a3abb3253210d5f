"""The scoring job: everything between "here is a checkpoint" and "here is its ranking".

Collect trajectories for the splits that have none (one engine for all of them),
POPI gradients for the pool and every validation split, then rank. Each step is
resumable, so rerunning a killed job continues where it stopped. The service's
``POST /v1/checkpoints`` runs exactly this.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cropi.generation import SamplingConfig, make_backend
from cropi.gradients import LossOptions
from cropi.pipeline.collect import CollectJob, collect
from cropi.pipeline.gradients import GradientJob, compute_gradients
from cropi.pipeline.progress import Progress
from cropi.pipeline.rank import rank
from cropi.projection import ProjectionSpec

POOL = "pool"
NAME = r"^[A-Za-z0-9_.-]+$"


class CollectOptions(BaseModel):
    """How missing trajectories are collected (CROPI: K=8 pool, K=32 validation, T=0.5)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["vllm", "hf"] = "vllm"
    reward: str = "math_verify"
    pool: SamplingConfig = SamplingConfig(samples=8)
    validation: SamplingConfig = SamplingConfig(samples=32)
    backend_options: dict = Field(default_factory=dict)


class ScoringRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME, description="checkpoint name")
    model: str = Field(description="checkpoint folder (Hugging Face layout)")
    pool: str = Field(description="prompt pool file")
    validation: dict[str, str] = Field(description="validation split name -> prompt file")
    trajectories: Optional[dict[str, str]] = Field(None, description="split -> trajectory store; missing ones are collected")
    spec: ProjectionSpec = ProjectionSpec()
    loss: LossOptions = LossOptions()
    collect: CollectOptions = CollectOptions()
    fusion: Literal["rrf", "max"] = "rrf"
    top_fraction: float = Field(0.1, gt=0, le=1)
    max_validation: int = Field(100, gt=0)
    dtype: Literal["float16", "float32"] = "float16"

    @field_validator("validation")
    @classmethod
    def _check_names(cls, v: dict[str, str]) -> dict[str, str]:
        if not v:
            raise ValueError("name at least one validation set")
        for name in v:
            if name == POOL or not re.fullmatch(NAME, name):
                raise ValueError(f"validation set name {name!r} must match {NAME} and not be {POOL!r}")
        return v


def run_scoring(request: ScoringRequest, *, root: str, progress: Progress | None = None) -> dict:
    """Score ``request.model`` under ``root`` (store at ``root/store``); returns a summary."""
    store = str(Path(root) / "store")
    splits = {POOL: request.pool, **request.validation}
    trajectories = _collect_missing(request, splits, root, progress)
    computed = {}
    for split in splits:
        job = GradientJob(model=request.model, trajectories=trajectories[split], store=store, split=split,
                          name=request.name, spec=request.spec, loss=request.loss, dtype=request.dtype)
        computed[split] = compute_gradients(job, progress)["computed"]
    result = rank(store, request.name, POOL, list(request.validation), fusion=request.fusion,
                  top_fraction=request.top_fraction, spec_id=request.spec.spec_id,
                  max_validation=request.max_validation)
    return {"name": request.name, "spec_id": request.spec.spec_id, "trajectories": trajectories,
            "computed": computed, "excluded": result.excluded, "ranked": int((result.ranking.rank > 0).sum())}


def _collect_missing(request: ScoringRequest, splits: dict[str, str], root: str, progress) -> dict[str, str]:
    given = dict(request.trajectories or {})
    missing = [s for s in splits if s not in given]
    if not missing:
        return given
    opts = request.collect
    with make_backend(opts.backend, request.model, **opts.backend_options) as backend:
        for split in missing:
            out = str(Path(root) / "trajectories" / request.name / split)
            sampling = opts.pool if split == POOL else opts.validation
            collect(CollectJob(model=request.model, prompts=splits[split], out=out, sampling=sampling,
                               backend=opts.backend, reward=opts.reward), progress, backend=backend)
            given[split] = out
    return given
