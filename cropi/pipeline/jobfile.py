"""Job files: one JSON document per scheduled job, validated by the same options models
as the CLI and the service, so a scheduler (SLURM, Kubernetes, cron, Ray) launches any
cropi job with one command: ``python jobs/run.py JOB.json`` or ``cropi job JOB.json``.

A job file names its ``kind`` and carries that kind's model::

    {"kind": "score", "root": "/runs/a", "request": {...ScoreRequest...}}
    {"kind": "curriculum", "root": "/runs/a", "config": {...CurriculumConfig...}}
    {"kind": "collect", "job": {...CollectJob...}, "ray": {"workers": 4}}
    {"kind": "gradients", "job": {...GradientJob...}}
    {"kind": "rank", "request": {...RankRequest...}}
    {"kind": "refresh", "job": {...RefreshJob...}}

Relative paths are the scheduler's business (give absolute ones). An array job passes
``shard`` (``I/N``) to collect or gradients, so N tasks share one store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from cropi.errors import InvalidInputError, format_validation_error
from cropi.pipeline.collect import CollectJob
from cropi.pipeline.curriculum import CurriculumConfig
from cropi.pipeline.compute_gradients import GradientJob
from cropi.pipeline.distribute import RayPlacement  # a job file's "ray": the CLI's placement, same defaults
from cropi.pipeline.progress import Progress
from cropi.pipeline.rank import RankRequest
from cropi.pipeline.refresh import RefreshJob
from cropi.pipeline.score import ScoreRequest


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CollectJobFile(_Closed):
    kind: Literal["collect"]
    job: CollectJob
    ray: Optional[RayPlacement] = None


class GradientsJobFile(_Closed):
    kind: Literal["gradients"]
    job: GradientJob
    ray: Optional[RayPlacement] = None


class RankJobFile(_Closed):
    kind: Literal["rank"]
    request: RankRequest


class RefreshJobFile(_Closed):
    kind: Literal["refresh"]
    job: RefreshJob


class ScoreJobFile(_Closed):
    kind: Literal["score"]
    root: str = Field(min_length=1, description="run root: trajectories/ and store/")
    request: ScoreRequest


class CurriculumJobFile(_Closed):
    kind: Literal["curriculum"]
    root: str = Field(min_length=1, description="run root: curricula/, trajectories/ and store/")
    config: CurriculumConfig


JobFile = Annotated[Union[CollectJobFile, GradientsJobFile, RankJobFile, RefreshJobFile, ScoreJobFile,
                                 CurriculumJobFile],
                    Field(discriminator="kind")]
_ADAPTER = TypeAdapter(JobFile)


def load_job_file(path: str | Path, shard: Optional[tuple[int, int]] = None) -> JobFile:
    """The validated job of ``path``; ``shard`` (from an array job) overrides the file's."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"job file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise InvalidInputError(f"job file {path} is not JSON: {e}") from None
    if shard is not None and isinstance(data, dict) and isinstance(data.get("job"), dict):
        data["job"] = {**data["job"], "shard": shard}
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise InvalidInputError(f"bad job file {path}: {format_validation_error(e, 'job')}") from None


def run_job_file(job: JobFile, progress: Progress | None = None):
    """Run one validated job; returns what its step returns (JSON-able)."""
    if isinstance(job, (CollectJobFile, GradientsJobFile)):
        from cropi.pipeline.collect import collect
        from cropi.pipeline.compute_gradients import compute_gradients

        fn = collect if isinstance(job, CollectJobFile) else compute_gradients
        if job.ray is not None:
            from cropi.pipeline.distribute import run_sharded

            return run_sharded(fn, job.job, job.ray, progress=progress)
        return fn(job.job, progress)
    if isinstance(job, RankJobFile):
        res = job.request.run()
        return {"meta": res.meta, "rows": res.rows()}
    if isinstance(job, RefreshJobFile):
        from cropi.pipeline.refresh import refresh, summary

        return summary(refresh(job.job, progress))
    if isinstance(job, ScoreJobFile):
        from cropi.pipeline.score import score_checkpoint

        return score_checkpoint(job.request, root=job.root, progress=progress).model_dump(mode="json")
    from cropi.pipeline.curriculum import run_curriculum

    return run_curriculum(job.config, root=job.root, progress=progress)
