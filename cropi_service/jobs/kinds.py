"""The built-in job kinds, run in worker processes: ``fn(params, *, root, progress) -> dict``.

The library is imported directly here (torch included): only workers import this module.
``score`` is the one place the service calls the library's scoring step.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Any, Callable

import numpy as np

from cropi.pipeline.curriculum import run_curriculum
from cropi.pipeline.rank import load_ranking
from cropi.pipeline.requests import store_path
from cropi.pipeline.score import ScoreRequest, score_checkpoint

from ..options.params import curriculum_config, scoring_request

Progress = Callable[[str, int, int], None]


def score(request: ScoreRequest, root: str, progress: Progress) -> dict[str, Any]:
    """Score one checkpoint with the library (collect if needed, gradients, rank)."""
    return score_checkpoint(request, root=root, progress=progress).model_dump(mode="json")


def scoring_job(params: dict[str, Any], *, root: str, progress: Progress) -> dict[str, Any]:
    """Run (or resume) a checkpoint's scoring; adds ``prompts_scored`` and ``spec_id`` to the result."""
    result = score(scoring_request(params), root, progress)
    # the ranking the library wrote, by the name it gave it (a selector's own: never guessed here)
    stored = PurePath(result["ranking"]).name.removesuffix(".parquet")
    ranking = load_ranking(store_path(root), result["name"], pool=stored, spec_id=result["spec_id"])
    return {**_jsonable(result), "spec_id": ranking.meta.get("spec_id", result["spec_id"]),
            "prompts_scored": ranking.table.num_rows}


def curriculum_job(params: dict[str, Any], *, root: str, progress: Progress) -> dict[str, Any]:
    """Run (or resume) a staged curriculum."""
    return _jsonable(run_curriculum(curriculum_config(params), root=root, progress=progress) or {})


BUILTIN: dict[str, Callable[..., dict[str, Any]]] = {"scoring": scoring_job, "curriculum": curriculum_job}


def _jsonable(value: Any) -> Any:
    """Plain JSON types (pydantic models dumped, numpy scalars and paths converted)."""
    if hasattr(value, "model_dump"):
        return _jsonable(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value
