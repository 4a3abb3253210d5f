"""Job parameters: what a worker receives, and how they become the library's requests.

The HTTP side stores a job's parameters as the closed, validated models of ``services.models``
(dumped to JSON); the worker validates them again here (a row edited in the database is refused
the same way) and builds the library's request field by field. This is the only place where a
caller's choices reach the library: the model is always the registered checkpoint folder,
engine arguments are the few ``Engine`` names, and trainer options are the closed per-trainer
models. The library's defaults stay the library's: an option left out is not set here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field

from ..api import schemas as models
from ..api.schemas import Strict
from ..domain.paths import confine_tree


Roots = Field(min_length=1, description="the service's data roots when the job was submitted (not the caller's)")


class ScoringParams(Strict):
    """A scoring job: the registered paths (already confined) and the caller's closed options."""

    roots: list[str] = Roots
    name: str = Field(pattern=models.NAME_PATTERN)
    model: str = Field(min_length=1, max_length=models.MAX_PATH)
    pool: str = Field(min_length=1, max_length=models.MAX_PATH)
    validation: dict[str, str] = Field(min_length=1, max_length=16)
    trajectories: Optional[dict[str, str]] = None
    projection: Optional[models.Projection] = None
    options: Optional[models.ScoringOptions] = None


class CurriculumParams(Strict):
    roots: list[str] = Roots
    name: str = Field(pattern=models.NAME_PATTERN)
    model: str = Field(min_length=1, max_length=models.MAX_PATH)
    pool: str = Field(min_length=1, max_length=models.MAX_PATH)
    validation: dict[str, str] = Field(min_length=1, max_length=16)
    stages: int = Field(ge=1, le=100)
    fraction: float = Field(gt=0, le=1)
    projection: Optional[models.Projection] = None
    options: Optional[models.CurriculumOptions] = None


def given(model: Optional[BaseModel]) -> dict[str, Any]:
    """The fields a caller set (None: not set, so the library's default holds)."""
    return model.model_dump(exclude_none=True) if model is not None else {}


def projection_fields(projection: Optional[models.Projection]) -> dict[str, Any]:
    return given(projection)


def spec_id(projection: Optional[models.Projection]) -> str:
    """The library's id of this projection spec."""
    # cropi.projection imports torch: imported on the first checkpoint POST, not at server start-up
    from cropi.projection import ProjectionSpec

    return ProjectionSpec(**projection_fields(projection)).spec_id


# the worker side: library requests

def check_confined(p: ScoringParams | CurriculumParams) -> None:
    """Confinement again, at job start: every file the job will open resolves under the data roots."""
    roots = [Path(r) for r in p.roots]
    for path in (p.model, p.pool, *p.validation.values(), *((getattr(p, "trajectories", None) or {}).values())):
        confine_tree(path, roots)


def scoring_request(params: dict[str, Any]):
    """The library's ``ScoreRequest`` for a scoring job's stored parameters (paths re-confined)."""
    from cropi.generation.options import CollectOptions
    from cropi.pipeline.score import ScoreRequest

    p = ScoringParams.model_validate(params)
    check_confined(p)
    o = p.options or models.ScoringOptions()
    fields: dict[str, Any] = {"name": p.name, "model": p.model, "pool": p.pool, "validation": p.validation,
                              "trajectories": p.trajectories, "projection": projection_fields(p.projection)}
    renamed = {"top_fraction": "select_fraction", "dtype": "gradient_dtype"}
    for key, value in given(o.model_copy(update={"collect": None, "loss": None})).items():
        fields[renamed.get(key, key)] = value
    if o.loss is not None:
        fields["loss"] = given(o.loss)
    fields["collect"] = _collect_fields(o.collect or models.Collect(), CollectOptions().backend)
    return ScoreRequest.model_validate(fields)


def _collect_fields(c: "models.Collect", default_backend: str) -> dict[str, Any]:
    """The library's CollectOptions from the service's: K per split kind, one sampling setup for both."""
    backend = c.backend or default_backend
    out: dict[str, Any] = {"backend": backend, "engine": models.engine_arguments(backend, c.engine)}
    if c.reward is not None:
        out["reward"] = c.reward
    shared: dict[str, Any] = {}
    for split in ("pool", "validation"):
        sampling = given(getattr(c, split))
        if "samples" in sampling:
            out[f"{split}_samples"] = sampling.pop("samples")
        for key, value in sampling.items():
            if shared.setdefault(key, value) != value:
                raise ValueError(f"options.collect: pool and validation ask for different {key} ({shared[key]} and "
                                 f"{value}); the offline trajectories of both are sampled with one {key}")
    return out | shared


def curriculum_config(params: dict[str, Any]):
    """The library's ``CurriculumConfig`` for a curriculum job's stored parameters."""
    from cropi.pipeline.curriculum import CollectOptions, CurriculumConfig

    p = CurriculumParams.model_validate(params)
    check_confined(p)
    o = p.options or models.CurriculumOptions()
    fields: dict[str, Any] = {"name": p.name, "model": p.model, "pool": p.pool, "validation": p.validation,
                              "stages": p.stages, "select_fraction": p.fraction,
                              "projection": projection_fields(p.projection),
                              **given(o.model_copy(update={"collect": None, "loss": None, "trainer": None}))}
    if o.loss is not None:
        fields["loss"] = given(o.loss)
    if o.trainer is not None:
        options = given(o.trainer)
        fields["trainer"] = options.pop("name")
        fields["trainer_options"] = options
    c = o.collect or models.CurriculumCollect()
    backend = c.backend or CollectOptions().backend
    fields["collect"] = {**given(c.model_copy(update={"engine": None})), "backend": backend,
                         "engine": models.engine_arguments(backend, c.engine)}
    return CurriculumConfig.model_validate(fields)
