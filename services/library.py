"""The one place where the service calls into cropi.

Two sides: the job functions the worker processes run (``scoring_job``, ``curriculum_job``,
with the worker's calling convention ``fn(params, *, root, progress) -> dict``), and
``CropiLibrary``, what the HTTP app reads (prompt counts, rankings, stored gradients, stage
subsets). cropi is imported lazily, so the service starts (and reports a clear 503) even when
an optional part of the library is missing.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Protocol

import numpy as np
import pyarrow as pa

from cropi.errors import InvalidInputError, NotFoundError
from services.errors import PipelineUnavailableError
from services.models import Projection
from services.options import curriculum_config, scoring_request, spec_id

POOL_SPLIT = "pool"  # the store split name run_scoring gives the pool


@dataclass
class RankingData:
    """A stored ranking: ``table`` has prompt_id, status, rank (1-based, 0 = excluded), fused,
    ``score:<validation set>`` columns and selected."""

    table: pa.Table
    excluded: dict[str, int]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class GradientData:
    """The stored projected vectors of one split, with their per-prompt metadata columns."""

    prompt_ids: list[str]
    vectors: np.ndarray
    columns: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageData:
    index: int
    subset: str | None = None
    n_prompts: int | None = None
    checkpoint: str | None = None


class Library(Protocol):
    """What the HTTP app needs from cropi (tests substitute a fake)."""

    def count_prompts(self, path: str) -> int: ...

    def projection_spec_id(self, projection: Projection | None) -> str: ...

    def ranking_version(self, name: str, spec_id: str) -> Hashable | None: ...

    def ranking(self, name: str, spec_id: str) -> RankingData: ...

    def gradients_version(self, name: str, spec_id: str, split: str) -> Hashable | None: ...

    def gradients(self, name: str, spec_id: str, split: str) -> GradientData: ...

    def curriculum_stages(self, name: str, result: dict[str, Any] | None) -> list[StageData]: ...


def _import(module: str, *names: str) -> tuple:
    """``names`` from ``module``, or PipelineUnavailableError saying what is missing."""
    try:
        mod = importlib.import_module(module)
        return tuple(getattr(mod, n) for n in names)
    except (ImportError, AttributeError) as e:
        raise PipelineUnavailableError(f"this installation lacks {module}.{'/'.join(names)} ({e}); "
                                       "install the full cropi package") from e


def store_of(root: str | os.PathLike) -> str:
    """The library's store under the service root."""
    return str(Path(root) / "store")


# the worker side: job functions

def scoring_job(params: dict[str, Any], *, root: str, progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    """Run (or resume) a checkpoint's scoring; adds ``prompts_scored`` and ``spec_id`` to the result."""
    (run_scoring,) = _import("cropi.pipeline.scoring", "run_scoring")
    (load_ranking,) = _import("cropi.pipeline.rank", "load_ranking")
    request = scoring_request(params)
    result = run_scoring(request, root=root, progress=progress) or {}
    spec_id = request.spec.spec_id if request.spec is not None else None
    ranking = load_ranking(store_of(root), request.name, pool=POOL_SPLIT, spec_id=spec_id)
    return {**_jsonable(result), "spec_id": ranking.meta.get("spec_id", spec_id),
            "prompts_scored": ranking.table.num_rows}


def curriculum_job(params: dict[str, Any], *, root: str, progress: Callable[[str, int, int], None]) -> dict[str, Any]:
    """Run (or resume) a staged curriculum."""
    (run_curriculum,) = _import("cropi.pipeline.curriculum", "run_curriculum")
    config = curriculum_config(params)
    return _jsonable(run_curriculum(config, root=root, progress=progress) or {})


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


# the app side

class CropiLibrary:
    """``Library`` over the real cropi, reading the store under ``root``."""

    def __init__(self, root: str | os.PathLike):
        self.root = str(root)
        self.store = store_of(root)

    def count_prompts(self, path: str) -> int:
        (load_prompts,) = _import("cropi.data.prompts", "load_prompts")
        return len(load_prompts(path))

    def projection_spec_id(self, projection: Projection | None) -> str:
        return spec_id(projection)

    def ranking_version(self, name: str, spec_id: str) -> Hashable | None:
        (ranking_path,) = _import("cropi.pipeline.rank", "ranking_path")
        fs, path = ranking_path(self.store, name, spec_id, POOL_SPLIT)
        info = fs.get_file_info(path)
        return (info.mtime_ns, info.size) if info.size is not None else None

    def ranking(self, name: str, spec_id: str) -> RankingData:
        (load_ranking,) = _import("cropi.pipeline.rank", "load_ranking")
        r = load_ranking(self.store, name, pool=POOL_SPLIT, spec_id=spec_id)
        return RankingData(r.table, dict(r.excluded), dict(r.meta))

    def gradients_version(self, name: str, spec_id: str, split: str) -> Hashable | None:
        (GradientStore,) = _import("cropi.store", "GradientStore")
        return GradientStore(self.store).open_split(name, spec_id, split).version()

    def gradients(self, name: str, spec_id: str, split: str) -> GradientData:
        (GradientStore,) = _import("cropi.store", "GradientStore")
        t = GradientStore(self.store).open_split(name, spec_id, split).read()
        meta = {"checkpoint": name, "spec_id": spec_id, "split": split, "fingerprint": t.checkpoint.fingerprint}
        return GradientData(list(t.prompt_ids), t.vectors, dict(t.columns), meta)

    def curriculum_stages(self, name: str, result: dict[str, Any] | None) -> list[StageData]:
        """Stages from the finished job's result, or, while it runs, from the curriculum's stored state."""
        if result is None:
            load_state, summary = _import("cropi.pipeline.curriculum", "load_state", "summary")
            try:
                result = summary(load_state(self.root, name))
            except NotFoundError:
                return []  # nothing stored yet: the job has not reached its first step
        stages = result.get("stages") or []
        if not isinstance(stages, list):
            raise InvalidInputError(f"curriculum {name!r}: its job result has no stage list")
        out = []
        for i, s in enumerate(stages):
            s = s if isinstance(s, dict) else {}
            out.append(StageData(int(s.get("index", i)), s.get("subset"), s.get("n_prompts"), s.get("checkpoint")))
        return out
