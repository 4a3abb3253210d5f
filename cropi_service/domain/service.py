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
from pathlib import Path
from typing import Any, Callable, Hashable, TypeVar

import anyio.to_thread
import pyarrow as pa

from cropi.contracts import POOL
from cropi.errors import CorruptDataError, CropiError, InvalidInputError

from ..base.errors import (BusyError, JobRunningError, NotReadyError, RankingConflictError, RegistryFullError,
                           ResponseTooLargeError, UnknownIdError)
from ..base.paths import confine
from ..base.settings import ServiceSettings
from ..jobs.runner import Runner
from ..jobs.table import Job, JobStore
from ..options.params import CurriculumParams, ScoringParams
from ..options.requests import CheckpointCreate, CurriculumCreate, DatasetCreate
from .cache import ByteLRU, NotLoaded, VersionedCache
from .flight import AnswerLedger, Reservation, Slots
from .library import Library
from .registry import CheckpointRow, CurriculumRow, DatasetRow, Registry, new_id
from .views import ARROW_STREAM, FUSED, GradientView, RankingView, record_bytes_bound

V = TypeVar("V")


def job_view(job: Job) -> dict[str, Any]:
    """The API form of a job row."""
    return {"id": job.id, "kind": job.kind, "state": job.state, "progress": job.progress, "error": job.error,
            "result": job.result, "attempts": job.attempts, "created": job.created, "updated": job.updated}


class Service:
    """The service's state and operations; one per app."""

    def __init__(self, settings: ServiceSettings, library: Library, runner: Runner, jobs: JobStore,
                 registry: Registry):
        self.settings, self.library, self.runner, self.jobs, self.registry = settings, library, runner, jobs, registry
        # every cache is bounded by bytes, whatever the number of checkpoints served
        self.rankings: VersionedCache[RankingView] = VersionedCache(mb(settings.ranking_views_mb), nbytes)
        # a loaded split is its key index: its vectors are read a record batch at a time into the
        # library's part cache, whose budget (gradient_cache_mb) holds for every split together
        self.gradient_views: VersionedCache[GradientView] = VersionedCache(mb(settings.gradient_views_mb), nbytes)
        self.rendered = ByteLRU(mb(settings.render_cache_mb))  # shared by every split's view
        self.ranking_pages = ByteLRU(mb(settings.ranking_cache_mb))  # and by every ranking's
        self.heavy = Slots(settings.heavy_requests)
        self.answers = AnswerLedger(mb(settings.answer_memory_mb), mb(settings.answer_memory_mb_per_caller),
                                    retry_after_s=max(1, round(min(settings.stall_timeout_s, 30))))
        self._registrations = threading.BoundedSemaphore(settings.max_registrations)
        self._registering = threading.Lock()  # a registration's count check and insert, together
        self._versions: dict[Hashable, tuple[float, Hashable | None]] = {}
        self._done: dict[str, Job] = {}

    def bounds(self) -> dict[str, Any]:
        """What the bounded memory holds now: (bytes, budget, entries) per cache, and answers in flight."""
        parts = getattr(self.library, "parts", None)
        caches = {name: (c.bytes, c.max_bytes, len(c)) for name, c in (
            ("ranking_views", self.rankings), ("gradient_views", self.gradient_views),
            ("ranking_pages", self.ranking_pages), ("rendered_gradients", self.rendered))}
        if parts is not None and hasattr(parts, "bytes"):
            caches["gradient_parts"] = (parts.bytes, parts.max_bytes, len(parts))
        return {"caches": caches, "answers": self.answers.snapshot(), "waiting": self.heavy.waiting}

    def confine(self, path: str) -> Path:
        return confine(path, self.settings.data_roots)

    def _roots(self) -> list[str]:
        """The data roots a job re-checks its paths against when it starts."""
        return [str(r) for r in self.settings.data_roots]

    # datasets

    def add_dataset(self, body: DatasetCreate) -> DatasetRow:
        path = self.confine(body.path)
        self._room_for_dataset()  # before the prompt file is read, and again before the row is written
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
        with self._registering:
            self._room_for_dataset()
            return self.registry.add_dataset(body.name, str(path), body.kind, n)

    def _room_for_dataset(self) -> None:
        self._room("datasets", self.registry.count("datasets"), self.settings.max_datasets, "max_datasets",
                   "DELETE /v1/datasets/{id} (GET /v1/datasets lists them; a dataset that a registered checkpoint "
                   "reads is kept until that checkpoint is removed)")

    def _room_for_checkpoint(self) -> None:
        self._room("checkpoints", self.registry.count("checkpoints"), self.settings.max_checkpoints,
                   "max_checkpoints", "DELETE /v1/checkpoints/{id} (GET /v1/checkpoints lists them; their stored "
                   "rankings and gradients stay in the store)")

    @staticmethod
    def _room(what: str, n: int, bound: int, setting: str, remove: str) -> None:
        if n >= bound:
            raise RegistryFullError(f"{n} {what} are registered, as many as this service holds ({setting}={bound}): "
                                    f"remove some you no longer need with {remove}, or ask the operator to raise "
                                    f"{setting}")

    def remove_dataset(self, dataset_id: str) -> DatasetRow:
        """Forget a dataset registration (the prompt file is not touched); refused while a registered
        checkpoint reads it."""
        with self._registering:
            return self.registry.remove_dataset(dataset_id)

    def datasets_page(self, offset: int, limit: int) -> dict[str, Any]:
        rows, total = self.registry.datasets(offset, limit)
        return {"items": [vars(d) for d in rows], "total": total, "offset": offset, "limit": limit}

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
        self._room_for_checkpoint()
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
        with self._registering:  # no job is queued for a registration past the bound
            self._room_for_checkpoint()
            job = self.runner.submit("scoring", params, key=scoring_key(body.name, spec_id), caller=caller)
            row = CheckpointRow(new_id("ck"), body.name, str(model), pool.id, [v.id for v in validation], spec_id,
                                job.id, time.time(), inputs)
            self.registry.add_checkpoint(row)
        return row

    def remove_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        """Forget a checkpoint registration. Its stored ranking and gradients stay in the store, and a later
        scoring under its name and spec from other inputs is still refused (they would be replaced)."""
        row = self.registry.checkpoint(checkpoint_id)
        job = self.jobs.get(row.job_id)
        if job.state in ("queued", "running"):
            raise JobRunningError(f"checkpoint {row.id} is being scored (job {job.id} is {job.state}): cancel it "
                                  f"with DELETE /v1/jobs/{job.id} first, or wait for it to finish")
        with self._registering:
            self.registry.remove_checkpoint(checkpoint_id)
        return row

    def checkpoints_page(self, offset: int, limit: int) -> dict[str, Any]:
        rows, total = self.registry.checkpoints(offset, limit)
        items = [{"id": r.id, "name": r.name, "path": r.path, "pool": r.pool, "validation": r.validation,
                  "spec_id": r.spec_id, "job_id": r.job_id, "created": r.created} for r in rows]
        return {"items": items, "total": total, "offset": offset, "limit": limit}

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
                  peek: bool = False) -> tuple[bytes | memoryview, str]:
        """A ``GradientBatch`` of ``prompt_ids`` as JSON bytes, or an Arrow IPC stream (a view of Arrow's
        buffer, not copied); and its media type.

        Refused (413) when it could exceed ``max_response_mb``. With ``peek``, NotLoaded unless every record
        batch needed is in memory. Batches from callers go through ``gradients_batch``, which takes a
        heavy slot and accounts for the answer's memory first."""
        row, view = self.gradient_view(checkpoint_id, split, peek)
        self.check_response_size(view, len(prompt_ids), arrow)
        return self._render(row, view, prompt_ids, split, arrow, peek)

    def _render(self, row: CheckpointRow, view: GradientView, prompt_ids: list[str], split: str | None, arrow: bool,
                peek: bool = False) -> tuple[bytes | memoryview, str]:
        rows = view.rows(prompt_ids)
        if arrow:
            return view.arrow_stream(rows, peek), ARROW_STREAM
        head = {"checkpoint": row.id, "spec_id": row.spec_id, "split": view.meta.get("split", split),
                "dim": view.dim}
        # encoded here, not through the response model: re-validating thousands of floats costs more than
        # the lookup
        return b"".join((json.dumps(head, separators=(",", ":")).encode()[:-1], b',"items":',
                         view.records_json(rows, peek), b"}")), "application/json"

    async def gradients_batch(self, checkpoint_id: str, prompt_ids: list[str], split: str | None, arrow: bool,
                              caller: str) -> tuple[bytes | memoryview, str, Reservation]:
        """``gradients`` for a caller's batch, served ``heavy_requests`` at a time.

        The turn is waited for in the event loop (at most ``heavy_wait_s``, then 429; past ``heavy_queue``
        waiting, 429 at once), never in a request thread, so waiting batches cannot starve the health
        check and the other routes of threads. With the turn, the answer's size bound is reserved in
        the answer ledger (refused 429/503 when it would not fit) before anything is made; the caller
        keeps the reservation until the answer is sent (``api.middleware.AnswerFlow`` releases it)."""
        try:  # a loaded split costs no thread hop
            row, view = self.gradient_view(checkpoint_id, split, peek=True)
        except NotLoaded:
            row, view = await self._off_loop(self.gradient_view, checkpoint_id, split)
        self.check_response_size(view, len(prompt_ids), arrow)
        got = await self.heavy.acquire(self.settings.heavy_wait_s, max_waiting=self.settings.heavy_queue)
        if not got:
            waited = (f"{self.settings.heavy_queue} more are waiting (heavy_queue)" if got is None else
                      f"this one waited {self.settings.heavy_wait_s:g} s for its turn")
            raise BusyError(f"{self.settings.heavy_requests} gradient batches are being made (heavy_requests) and "
                            f"{waited}: retry after the time in Retry-After, or send single lookups",
                            retry_after_s=max(1, round(self.settings.heavy_wait_s)))
        try:
            held = self.answers.reserve(caller, batch_bytes_bound(view, len(prompt_ids), arrow))
            try:
                body, media = await self._off_loop(self._render, row, view, prompt_ids, split, arrow)
            except BaseException:
                held.release()
                raise
        finally:
            self.heavy.release()
        held.resize(len(body))  # what is held from now on: the answer itself
        return body, media, held

    @staticmethod
    async def _off_loop(fn: Callable[..., V], *args: Any) -> V:
        """``fn(*args)`` in a request thread (it reads the store or makes a large answer). Not abandoned
        when the request is cancelled: the turn and the reservation are given back only once it is done."""
        return await anyio.to_thread.run_sync(lambda: fn(*args))

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
                   "subset_url": f"/v1/curricula/{row.id}/stages/{s.get('index', i)}/subset" if s.get("subset") else None,
                   "checks": s.get("checks"), "cost_s": s.get("cost_s"),
                   "warnings": (s.get("selection") or {}).get("warnings"),
                   "ranking_change": (s.get("selection") or {}).get("ranking_change")}
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


def mb(value: float) -> int:
    return int(value * 2**20)


def nbytes(view: Any) -> int:
    return view.nbytes


def batch_bytes_bound(view: GradientView, n: int, arrow: bool) -> int:
    """The most bytes a batch of ``n`` records can take as an answer (the bound ``max_response_mb`` is
    checked against)."""
    return n * record_bytes_bound(view.dim, view.dtype, arrow) + 4096


def digest(value: Any) -> str:
    """sha256 of canonical JSON: equal for equal inputs."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def scoring_key(name: str, spec_id: str | None) -> str:
    """The job key that allows one active scoring per checkpoint name and projection spec."""
    return f"scoring:{name}:{spec_id}"
