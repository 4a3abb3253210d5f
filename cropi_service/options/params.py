"""Job parameters: what a worker receives, and the library request they become.

The HTTP side stores a job's parameters as JSON: the registered paths (already confined) and the
caller's options, closed models derived from the library's (``caller``). The worker validates them
again here (a row edited in the database is refused the same way) and builds the library's
request. The caller models carry the library's own field names, so the request is the paths plus
the options as set: an option left out keeps the library's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import Field

from cropi.contracts import NAME_PATTERN
from cropi.pipeline.curriculum.config import CurriculumConfig
from cropi.pipeline.requests import ScoreRequest
from cropi.projection.spec import ProjectionSpec

from ..base.paths import confine_tree
from .caller import CurriculumOptions, Fraction, Projection, ScoringOptions, Stages
from .derive import set_fields
from .requests import MAX_PATH, Strict

Roots = Field(min_length=1, description="the service's data roots when the job was submitted (not the caller's)")


class JobParams(Strict):
    """The registered paths of a job (confined when it was submitted) and its projection."""

    roots: list[str] = Roots
    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(min_length=1, max_length=MAX_PATH)
    pool: str = Field(min_length=1, max_length=MAX_PATH)
    validation: dict[str, str] = Field(min_length=1, max_length=16)
    projection: Optional[Projection] = None

    def paths(self) -> list[str]:
        return [self.model, self.pool, *self.validation.values()]

    def check_confined(self) -> None:
        """Confinement again, at job start: every file the job will open resolves under the data roots."""
        roots = [Path(r) for r in self.roots]
        for path in self.paths():
            confine_tree(path, roots)

    def library_fields(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "pool": self.pool, "validation": self.validation,
                "projection": set_fields(self.projection)}


class ScoringParams(JobParams):
    """A scoring job: the caller's trajectories (confined) and options."""

    trajectories: Optional[dict[str, str]] = None
    options: Optional[ScoringOptions] = None

    def paths(self) -> list[str]:
        return [*super().paths(), *(self.trajectories or {}).values()]

    def library_request(self) -> ScoreRequest:
        return ScoreRequest.model_validate({**self.library_fields(), "trajectories": self.trajectories,
                                            **set_fields(self.options)})


class CurriculumParams(JobParams):
    stages: Stages  # the request's bounds, judged again at job start
    fraction: Fraction
    options: Optional[CurriculumOptions] = None

    def library_config(self) -> CurriculumConfig:
        options = set_fields(self.options)
        trainer = options.pop("trainer", None)
        if trainer is not None:  # the caller names a trainer with its options; the library keeps them apart
            options |= {"trainer": trainer.pop("name"), "trainer_options": trainer}
        return CurriculumConfig.model_validate({**self.library_fields(), "stages": self.stages,
                                                "select_fraction": self.fraction, **options})


def spec_id(projection: Optional[Projection]) -> str:
    """The library's id of this projection spec."""
    return ProjectionSpec(**set_fields(projection)).spec_id


def scoring_request(params: dict[str, Any]) -> ScoreRequest:
    """The library's ``ScoreRequest`` for a scoring job's stored parameters (paths re-confined)."""
    p = ScoringParams.model_validate(params)
    p.check_confined()
    return p.library_request()


def curriculum_config(params: dict[str, Any]) -> CurriculumConfig:
    """The library's ``CurriculumConfig`` for a curriculum job's stored parameters (paths re-confined)."""
    p = CurriculumParams.model_validate(params)
    p.check_confined()
    return p.library_config()
