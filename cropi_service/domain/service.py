"""What the endpoints do, without HTTP: registration, job submission, reading results.

Stored results are served from in-memory views cached per (checkpoint, spec[, split]) and
keyed by a version token of what is stored (the ranking file's mtime and size, a split's
manifest), so a page request never re-reads the store unless the stored result changed.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, TypeVar

import pyarrow as pa

from cropi.contracts import POOL
from cropi.errors import CorruptDataError, CropiError, InvalidInputError

from ..base.errors import BusyError, NotReadyError, RankingConflictError, ResponseTooLargeError, UnknownIdError
from ..base.paths import confine
from ..base.settings import ServiceSettings
from ..jobs.runner import Runner
from ..jobs.table import Job, JobStore
from ..options.params import CurriculumParams, ScoringParams
from ..options.requests import CheckpointCreate, CurriculumCreate, DatasetCreate
from .cache import ByteLRU, NotLoaded, VersionedCache
from .library import Library
from .registry import CheckpointRow, CurriculumRow, DatasetRow, Registry, new_id
from .views import ARROW_STREAM, FUSED, GradientView, RankingView, record_bytes_bound

V = TypeVar("V")
RANKING_CACHE_SIZE = 16
# A loaded split is its key index (about 16 bytes a prompt): its vectors are read a record batch at a
# time into the library's part cache, whose budget (gradient_cache_mb) holds for every split together.
GRADIENT_CACHE_SIZE = 64


def job_view(job: Job) -> dict[str, Any]:
    """The API form of a job row."""
    return {"id": job.id, "kind": job.kind, "state": job.state, "progress": job.progress, "error": job.error,
            "result": job.result, "attempts": job.attempts, "created": job.created, "updated": job.updated}


class Service:
    """The service's state and operations; one per app."""

    def __init__(self, settings: ServiceSettings, library: Library, runner: Runner, jobs: JobStore,
                 registry: Registry):
        self.settings, self.library, self.runner, self.jobs, self.registry = settings, library, runner, jobs, registry
        self.rankings: VersionedCache[RankingView] = VersionedCache(RANKING_CACHE_SIZE)
        self.gradient_views: VersionedCache[GradientView] = VersionedCache(GRADIENT_CACHE_SIZE)
        self.rendered = ByteLRU(int(settings.render_cache_mb * 2**20))  # shared by every split's view
        self.ranking_pages = ByteLRU(int(settings.ranking_cache_mb * 2**20))  # and by every ranking's
        self._heavy = threading.BoundedSemaphore(settings.heavy_requests)
        self._registrations = threading.BoundedSemaphore(settings.max_registrations)
        self._versions: dict[Hashable, tuple[float, Hashable | None]] = {}
        self._done: dict[str, Job] = {}

    def confine(self, path: str) -> Path:
        return confine(path, self.settings.data_roots)

    def _roots(self) -> list[str]:
        """The data roots a job re-checks its paths against when it starts."""
        return [str(r) for r in self.settings.data_roots]

    # datasets

    def add_dataset(self, body: DatasetCreate) -> DatasetRow:
        path = self.confine(body.path)
        if not path.is_file() and not path.is_dir():
            raise InvalidInputError(f"no prompt file at {body.path!r} (resolved to {str(path)!r}): "
                                    "check the path; it is read on the service's machine")
        if not self._registrations.acquire(blocking=False):
            raise BusyError(f"{self.settings.max_registrations} dataset registrations are reading their prompt files "
                            "(max_registrations): register this one when they are done", retry_after_s=5)
        try:  # reading a large prompt file takes seconds: a few at a time, the other request threads stay free
            n = self.library.count_prompts(str(path))
        finally:
            self._registrations.release()
        if n == 0:
            raise InvalidInputError(f"{body.path!r} holds no prompts: a dataset needs at least one")
        return self.registry.add_dataset(body.name, str(path), body.kind, n)

    def _datasets(self, pool_id: str, validation_ids: list[str]) -> tuple[DatasetRow, list[DatasetRow]]:
        pool = self.registry.dataset(pool_id)
        if pool.kind != "pool":
            raise InvalidInputError(f"dataset {pool_id} ({pool.name!r}) is a {pool.kind} set; `pool` needs a "
                                    "dataset registered with kind=pool")
        if len(set(validation_ids)) != len(validation_ids):
            raise InvalidInputError("`validation` lists a dataset more than once")
        validation = [self.registry.dataset(v) for v in validation_ids]
        for v in validation:
            if v.kind != "validation":
                raise InvalidInputError(f"dataset {v.id} ({v.name!r}) is a {v.kind} set; `validation` needs "
                                        "datasets registered with kind=validation")
            if v.name in (POOL, FUSED):
                raise InvalidInputError(f"a validation set may not be named {v.name!r} (reserved for the pool's "
                                        "split and the fused order): register it under another name")
        # paths were confined at registration; confine again in case the roots changed since
        for d in (pool, *validation):
            self.confine(d.path)
        return pool, validation

    # checkpoints

    def add_checkpoint(self, body: CheckpointCreate, caller: str | None = None) -> CheckpointRow:
        model = self.confine(body.path)
        if not model.is_dir():
            raise InvalidInputError(f"no model folder at {body.path!r} (resolved to {str(model)!r}): a checkpoint "
                                    "is a Hugging Face model directory on the service's machine")
        pool, validation = self._datasets(body.pool, body.validation)
        splits = {POOL: POOL, pool.name: POOL, **{v.name: v.name for v in validation}}
        trajectories = None
        if body.trajectories is not None:
            unknown = sorted(set(body.trajectories) - set(splits))
            if unknown:
                raise InvalidInputError(f"trajectories for unknown splits {unknown}: use "
                                        f"{sorted(set(splits))}")
            trajectories = {splits[k]: str(self.confine(v)) for k, v in body.trajectories.items()}
        spec_id = self.library.projection_spec_id(body.projection)
        job_params = ScoringParams(roots=self._roots(), name=body.name, model=str(model), pool=pool.path,
                                   validation={v.name: v.path for v in validation}, trajectories=trajectories,
                                   projection=body.projection, options=body.options)
        job_params.library_request()  # the library judges the whole request now, not when the job starts
        params = job_params.model_dump(exclude_none=True)
        # the store keeps one ranking per (name, spec): scoring it again from other inputs would
        # silently replace what the earlier checkpoint id serves, so that is refused
        inputs = digest({k: v for k, v in params.items() if k != "roots"})
        earlier = self.registry.scored_with_other_inputs(body.name, spec_id, inputs)
        if earlier is not None:
            raise RankingConflictError(
                f"checkpoint {earlier.id} was already scored under the name {body.name!r} with this projection "
                f"spec ({spec_id}) from other inputs (model, datasets, trajectories or options); scoring again "
                "would replace the ranking it serves. Register this scoring under another name")
        job = self.runner.submit("scoring", params, key=scoring_key(body.name, spec_id), caller=caller)
        row = CheckpointRow(new_id("ck"), body.name, str(model), pool.id, [v.id for v in validation], spec_id,
                            job.id, time.time(), inputs)
        self.registry.add_checkpoint(row)
        return row

    def checkpoint_view(self, checkpoint_id: str) -> dict[str, Any]:
        row = self.registry.checkpoint(checkpoint_id)
        return {"id": row.id, "name": row.name, "path": row.path, "pool": row.pool, "validation": row.validation,
                "spec_id": row.spec_id, "job": job_view(self.jobs.get(row.job_id)), "created": row.created}

    def _succeeded(self, job_id: str, what: str, peek: bool = False) -> Job:
        job = self._done.get(job_id)
        if job is not None:
            return job
        if peek:
            raise NotLoaded(job_id)
        job = self.jobs.get(job_id)
        if job.state != "succeeded":
            detail = f": {job.error['message']}" if job.error else ""
            raise NotReadyError(f"{what} is not available: its job {job.id} is {job.state}{detail}. "
                                f"Poll GET /v1/jobs/{job.id}" + ("" if job.state in ("queued", "running")
                                                               else " and POST the checkpoint again"))
        self._done[job_id] = job  # final: a succeeded job never changes, so it is read once
        return job

    # reads. With ``peek``, a read uses only what is in memory and fresh, and raises NotLoaded at the
    # first step that would read the database or the disk (the fast path then hands the request to
    # the full route); the steps are the same either way.

    def _version(self, key: Hashable, stamp: Callable[[], Hashable | None], peek: bool = False) -> Hashable | None:
        """The stored version of ``key``, looked at most every ``version_ttl_s``: a file changed on disk
        is noticed within that time and read (and verified) again."""
        now = time.monotonic()
        seen = self._versions.get(key)
        if seen is not None and now - seen[0] < self.settings.version_ttl_s:
            return seen[1]
        if peek:
            raise NotLoaded(key)
        token = stamp()
        self._versions[key] = (now, token)
        return token

    def _token(self, key: Hashable, stamp: Callable[[], Hashable | None], row: CheckpointRow, job: Job,
               peek: bool) -> Hashable:
        """``_version``, or without a stored file to stat, the newest successful scoring of (name, spec)."""
        token = self._version(key, stamp, peek)
        if token:
            return token
        if peek:  # versioned by the job table, which is not in memory
            raise NotLoaded(key)
        latest = self.jobs.latest_succeeded(scoring_key(row.name, row.spec_id)) or job
        return ("job", latest.id, latest.updated)

    @staticmethod
    def _load(what: str, load: Callable[[], V]) -> Callable[[], V]:
        """``load``, with a store that cannot be read reported as such (never a bare 500)."""

        def checked() -> V:
            try:
                return load()
            except CropiError:
                raise
            except (OSError, ValueError, KeyError, pa.ArrowException) as e:
                raise CorruptDataError(f"{what} cannot be read ({type(e).__name__}: {e}); the file changed or was "
                                       "damaged on disk: score the checkpoint again") from e

        return checked

    @staticmethod
    def _cached(cache: VersionedCache[V], key: Hashable, token: Hashable, load: Callable[[], V], peek: bool) -> V:
        return cache.peek(key, token) if peek else cache.get(key, token, load)

    # rankings

    def ranking_view(self, row: CheckpointRow, peek: bool = False) -> RankingView:
        job = self._succeeded(row.job_id, f"the ranking of checkpoint {row.id}", peek)
        key = (row.name, row.spec_id)
        token = self._token(key, lambda: self.library.ranking_version(row.name, row.spec_id), row, job, peek)
        load = self._load(f"the stored ranking of checkpoint {row.id} ({row.name}, spec {row.spec_id})",
                          lambda: RankingView(self.library.ranking(row.name, row.spec_id), self.ranking_pages))
        return self._cached(self.rankings, key, token, load, peek)

    def ranking_page(self, checkpoint_id: str, offset: int, limit: int, validation: str | None,
                     peek: bool = False) -> bytes:
        """A ``RankingPage`` as JSON bytes (the items come pre-encoded from the view)."""
        row = self.registry.checkpoint(checkpoint_id, peek)
        view = self.ranking_view(row, peek)
        order = validation or FUSED
        items = view.page_json(order, offset, limit, peek)
        head = {"checkpoint": row.id, "spec_id": row.spec_id, "order": order, "total": view.total,
                "offset": offset, "limit": limit, "excluded": view.excluded,
                "selection": view.meta.get("selection")}
        return b"".join((json.dumps(head, separators=(",", ":")).encode()[:-1], b',"items":', items, b"}"))

    # gradients

    def gradient_view(self, checkpoint_id: str, split: str | None,
                      peek: bool = False) -> tuple[CheckpointRow, GradientView]:
        row = self.registry.checkpoint(checkpoint_id, peek)
        job = self._succeeded(row.job_id, f"the gradients of checkpoint {row.id}", peek)
        split = split or POOL
        allowed = {POOL, *(self.registry.dataset(v, peek).name for v in row.validation)}
        if split not in allowed:
            raise UnknownIdError(f"checkpoint {row.id} has no split {split!r}; its splits: {sorted(allowed)}")
        key = (row.name, row.spec_id, split)
        what = f"the stored gradients of checkpoint {row.id}, split {split!r}"
        version = self._load(what, lambda: self.library.gradients_version(row.name, row.spec_id, split))
        token = self._token(key, version, row, job, peek)
        load = self._load(what, lambda: GradientView(self.library.gradients(row.name, row.spec_id, split),
                                                     rendered=self.rendered))
        return row, self._cached(self.gradient_views, key, token, load, peek)

    def gradients(self, checkpoint_id: str, prompt_ids: list[str], split: str | None, arrow: bool,
                  peek: bool = False) -> tuple[bytes, str]:
        """A ``GradientBatch`` of ``prompt_ids`` as JSON bytes, or an Arrow IPC stream; and its media type.

        Refused (413) when it could exceed ``max_response_mb``; batches wait for one of ``heavy_requests``
        slots. With ``peek``, NotLoaded unless every record batch needed is in memory."""
        row, view = self.gradient_view(checkpoint_id, split, peek)
        self.check_response_size(view, len(prompt_ids), arrow)
        with self.heavy_slot(len(prompt_ids)):
            rows = view.rows(prompt_ids)
            if arrow:
                return view.arrow_stream(rows, peek), ARROW_STREAM
            head = {"checkpoint": row.id, "spec_id": row.spec_id, "split": view.meta.get("split", split),
                    "dim": view.dim}
            # encoded here, not through the response model: re-validating thousands of floats costs more than
            # the lookup
            return b"".join((json.dumps(head, separators=(",", ":")).encode()[:-1], b',"items":',
                             view.records_json(rows, peek), b"}")), "application/json"

    def check_response_size(self, view: GradientView, n: int, arrow: bool) -> None:
        """ResponseTooLargeError unless ``n`` records can not exceed ``max_response_mb``, whatever their values."""
        limit = int(self.settings.max_response_mb * 2**20)
        each = record_bytes_bound(view.dim, view.dtype, arrow)
        if n * each > limit:
            fits = max(1, limit // each)
            raise ResponseTooLargeError(
                f"{n} gradients of {view.dim} values can take up to {n * each / 2**20:.0f} MB as "
                f"{'Arrow' if arrow else 'JSON'}, over this service's limit of {self.settings.max_response_mb:g} MB "
                f"(max_response_mb): send at most {fits} prompt ids per request and page through the rest"
                + ("" if arrow else f", or ask for Arrow (Accept: {ARROW_STREAM}), which fits "
                   f"{max(1, limit // record_bytes_bound(view.dim, view.dtype, True))}"))

    @contextmanager
    def heavy_slot(self, n: int) -> Iterator[None]:
        """Batches are served ``heavy_requests`` at a time: the rest wait (up to ``heavy_wait_s``, then 429),
        so their memory together stays under heavy_requests x max_response_mb. Single lookups go straight."""
        if n <= 1:
            yield
            return
        if not self._heavy.acquire(timeout=self.settings.heavy_wait_s):
            raise BusyError(f"{self.settings.heavy_requests} gradient batches are being served (heavy_requests) and "
                            f"this one waited {self.settings.heavy_wait_s:g} s for its turn: retry later, or send "
                            "single lookups", retry_after_s=max(1, round(self.settings.heavy_wait_s)))
        try:
            yield
        finally:
            self._heavy.release()

    # curricula

    def add_curriculum(self, body: CurriculumCreate, caller: str | None = None) -> CurriculumRow:
        model = self.confine(body.path)
        if not model.is_dir():
            raise InvalidInputError(f"no model folder at {body.path!r} (resolved to {str(model)!r})")
        pool, validation = self._datasets(body.pool, body.validation)
        job_params = CurriculumParams(roots=self._roots(), name=body.name, model=str(model), pool=pool.path,
                                      validation={v.name: v.path for v in validation}, stages=body.stages,
                                      fraction=body.fraction, projection=body.projection, options=body.options)
        job_params.library_config()  # the library judges the whole config now, not when the job starts
        params = job_params.model_dump(exclude_none=True)
        job = self.runner.submit("curriculum", params, key=f"curriculum:{body.name}", caller=caller)
        row = CurriculumRow(new_id("cur"), body.name, job.id, time.time())
        self.registry.add_curriculum(row)
        return row

    def curriculum_view(self, curriculum_id: str) -> dict[str, Any]:
        row = self.registry.curriculum(curriculum_id)
        job = self.jobs.get(row.job_id)
        stages = [{"index": int(s.get("index", i)), "n_prompts": s.get("n_prompts"), "checkpoint": s.get("checkpoint"),
                   "subset_url": f"/v1/curricula/{row.id}/stages/{s.get('index', i)}/subset" if s.get("subset") else None}
                  for i, s in enumerate(self.library.curriculum_stages(row.name, job.result))]
        return {"id": row.id, "name": row.name, "job": job_view(job), "stages": stages, "created": row.created}

    def stage_subset(self, curriculum_id: str, index: int) -> Path:
        row = self.registry.curriculum(curriculum_id)
        job = self.jobs.get(row.job_id)
        for i, s in enumerate(self.library.curriculum_stages(row.name, job.result)):
            if s.get("index", i) == index and s.get("subset"):
                # library output: under the service root or a data root, never elsewhere
                path = confine(s["subset"], [self.settings.root, *self.settings.data_roots])
                if not path.is_file():
                    raise UnknownIdError(f"stage {index} of curriculum {row.id} lists {s['subset']}, which is gone")
                return path
        raise UnknownIdError(f"curriculum {row.id} has no stage {index} subset yet (job {job.id} is {job.state}); "
                             "GET the curriculum for its stages")


def digest(value: Any) -> str:
    """sha256 of canonical JSON: equal for equal inputs."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def scoring_key(name: str, spec_id: str | None) -> str:
    """The job key that allows one active scoring per checkpoint name and projection spec."""
    return f"scoring:{name}:{spec_id}"
