"""The v1 HTTP routes: thin wrappers over ``Service``.

Each route's contract (path, parameters and their bounds) is its signature here. The two hot reads
keep their body in a reader (``HOT_READS``) that the route calls and the fast path (middleware
``HotPaths``) calls too, after validating the request against the same signature."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import FileResponse

import cropi
from cropi.contracts import NAME_MAX
from cropi.pipeline.curriculum.config import MAX_STAGES  # any stage the library writes

from ..domain.service import Service, job_view
from .middleware import ANONYMOUS, hold_answer
from ..domain.views import ARROW_STREAM
from ..options.requests import ID_MAX, CheckpointCreate, CurriculumCreate, DatasetCreate
from . import schemas as models

ERRORS = {status: {"model": models.ErrorResponse, "description": what} for status, what in {
    400: "bad input", 401: "missing or wrong token", 403: "a path outside the data roots",
    404: "unknown id", 409: "conflict (a job running, a result not ready)", 413: "body too large",
    422: "invalid request fields"}.items()}
ARROW_RESPONSE = {"content": {"application/json": {}, ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}},
                  "description": "JSON, or an Arrow IPC stream with `Accept: application/vnd.apache.arrow.stream`"}
PARQUET = "application/vnd.apache.parquet"

BUSY = {"model": models.ErrorResponse, "description": "a bound on work or memory in flight is reached: retry "
        "after the seconds in Retry-After (429: yours, 503: the server's)"}
router = APIRouter(responses=ERRORS)
Id = Annotated[str, Path(min_length=1, max_length=ID_MAX)]


def service(request: Request) -> Service:
    return request.app.state.service


def caller(request: Request) -> str | None:
    """Whose token the request carried (set by the auth middleware)."""
    return getattr(request.state, "caller", None)


def wants_arrow(accept: str | None) -> bool:
    return bool(accept) and ARROW_STREAM in accept


@router.get("/healthz", response_model=models.Health, tags=["service"], responses={})
async def healthz() -> dict:
    """Liveness: answers without a token, in the event loop (no request thread: busy threads never delay it)."""
    return {"status": "ok", "version": cropi.__version__}


@router.get("/metrics", tags=["service"], response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}})
def metrics(request: Request) -> Response:
    """Prometheus metrics: request latency by route, jobs by state, prompts scored."""
    return Response(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


# datasets

@router.post("/v1/datasets", status_code=201, response_model=models.Dataset, tags=["datasets"])
def create_dataset(body: DatasetCreate, request: Request) -> dict:
    """Register a prompt pool or a validation set by path (the file must load)."""
    return vars(service(request).add_dataset(body))


Offset = Annotated[int, Query(ge=0, le=models.OFFSET_MAX)]
ListLimit = Annotated[int, Query(ge=1, le=models.LIST_MAX)]


@router.get("/v1/datasets", response_model=models.DatasetList, tags=["datasets"])
def list_datasets(request: Request, offset: Offset = 0, limit: ListLimit = models.LIST_DEFAULT) -> dict:
    """A page of the registered datasets, oldest first, with how many there are."""
    return service(request).datasets_page(offset, limit)


@router.get("/v1/datasets/{dataset_id}", response_model=models.Dataset, tags=["datasets"])
def get_dataset(dataset_id: Id, request: Request) -> dict:
    return vars(service(request).registry.dataset(dataset_id))


@router.delete("/v1/datasets/{dataset_id}", response_model=models.Dataset, tags=["datasets"])
def delete_dataset(dataset_id: Id, request: Request) -> dict:
    """Forget a dataset registration (its file is not touched); refused (409) while a registered
    checkpoint reads it."""
    return vars(service(request).remove_dataset(dataset_id))


# checkpoints and jobs

@router.post("/v1/checkpoints", status_code=202, response_model=models.CheckpointCreated, tags=["checkpoints"])
def create_checkpoint(body: CheckpointCreate, request: Request) -> dict:
    """Register a checkpoint and start its scoring job; answers at once with the job id."""
    row = service(request).add_checkpoint(body, caller(request))
    return {"id": row.id, "job_id": row.job_id}


@router.get("/v1/checkpoints", response_model=models.CheckpointList, tags=["checkpoints"])
def list_checkpoints(request: Request, offset: Offset = 0, limit: ListLimit = models.LIST_DEFAULT) -> dict:
    """A page of the registered checkpoints, oldest first, with how many there are."""
    return service(request).checkpoints_page(offset, limit)


@router.get("/v1/checkpoints/{checkpoint_id}", response_model=models.Checkpoint, tags=["checkpoints"])
def get_checkpoint(checkpoint_id: Id, request: Request) -> dict:
    return service(request).checkpoint_view(checkpoint_id)


@router.delete("/v1/checkpoints/{checkpoint_id}", response_model=models.Checkpoint, tags=["checkpoints"])
def delete_checkpoint(checkpoint_id: Id, request: Request) -> dict:
    """Forget a checkpoint registration; refused (409) while it is being scored. Its stored ranking and
    gradients stay in the store, and its name and projection spec stay taken by what it scored."""
    svc = service(request)
    view = svc.checkpoint_view(checkpoint_id)
    svc.remove_checkpoint(checkpoint_id)
    return view


@router.get("/v1/jobs/{job_id}", response_model=models.JobView, tags=["jobs"])
def get_job(job_id: Id, request: Request) -> dict:
    """State (queued, running, succeeded, failed, cancelled), progress and error of a job."""
    return job_view(service(request).jobs.get(job_id))


@router.delete("/v1/jobs/{job_id}", response_model=models.JobView, tags=["jobs"])
def cancel_job(job_id: Id, request: Request) -> dict:
    """Cancel a queued or running job (its worker is stopped)."""
    return job_view(service(request).runner.cancel(job_id))


def respond(answer: tuple[bytes, str]) -> Response:
    body, media_type = answer
    return Response(body, media_type=media_type)


def read_ranking(svc: Service, checkpoint_id: str, offset: int, limit: int, validation: str | None,
                 peek: bool = False) -> tuple[bytes, str]:
    return svc.ranking_page(checkpoint_id, offset, limit, validation, peek), "application/json"


def read_gradient(svc: Service, checkpoint_id: str, prompt_id: str, split: str | None, accept: str | None,
                  peek: bool = False) -> tuple[bytes | memoryview, str]:
    return svc.gradients(checkpoint_id, [prompt_id], split, wants_arrow(accept), peek)


HOT_READS = {"get_ranking": read_ranking, "get_gradient": read_gradient}  # route name -> its reader


@router.get("/v1/checkpoints/{checkpoint_id}/ranking", response_model=models.RankingPage, tags=["checkpoints"])
def get_ranking(checkpoint_id: Id, request: Request,
                offset: Annotated[int, Query(ge=0, le=models.OFFSET_MAX)] = 0,
                limit: Annotated[int, Query(ge=1, le=models.PAGE_MAX)] = models.PAGE_DEFAULT,
                validation: Annotated[str | None, Query(max_length=NAME_MAX, description="sort by this validation set's "
                                                        "score instead of the fused score")] = None) -> Response:
    """A page of the ranked pool, best first, with counts of excluded prompts by status."""
    return respond(read_ranking(service(request), checkpoint_id, offset, limit, validation))


@router.get("/v1/checkpoints/{checkpoint_id}/gradients/{prompt_id:path}", response_model=models.GradientBatch,
            tags=["gradients"], responses={200: ARROW_RESPONSE})
def get_gradient(checkpoint_id: Id, prompt_id: Annotated[str, Path(max_length=models.PROMPT_ID_MAX)], request: Request,
                 split: Annotated[str | None, Query(max_length=NAME_MAX, description="default: the pool")] = None,
                 accept: Annotated[str | None, Header()] = None):
    """One prompt's stored projected gradient with its metadata."""
    return respond(read_gradient(service(request), checkpoint_id, prompt_id, split, accept))


@router.post("/v1/checkpoints/{checkpoint_id}/gradients:batch", response_model=models.GradientBatch,
             tags=["gradients"], responses={200: ARROW_RESPONSE, 429: BUSY, 503: BUSY})
async def get_gradients(checkpoint_id: Id, body: models.GradientBatchRequest, request: Request,
                        accept: Annotated[str | None, Header()] = None):
    """Several prompts' stored projected gradients, in the order asked. Made a few at a time
    (heavy_requests); the answer's memory counts against its caller until it is read."""
    answer, media_type, held = await service(request).gradients_batch(
        checkpoint_id, body.prompt_ids, body.split, wants_arrow(accept), caller(request) or ANONYMOUS)
    hold_answer(request.scope, held)  # released by AnswerFlow once the last byte is sent
    return Response(answer, media_type=media_type)


# curricula

@router.post("/v1/curricula", status_code=202, response_model=models.CurriculumCreated, tags=["curricula"])
def create_curriculum(body: CurriculumCreate, request: Request) -> dict:
    """Start a staged CROPI curriculum (score, select, train, repeat)."""
    row = service(request).add_curriculum(body, caller(request))
    return {"id": row.id, "job_id": row.job_id}


@router.get("/v1/curricula/{curriculum_id}", response_model=models.Curriculum, tags=["curricula"])
def get_curriculum(curriculum_id: Id, request: Request) -> dict:
    return service(request).curriculum_view(curriculum_id)


@router.get("/v1/curricula/{curriculum_id}/stages/{index}/subset", tags=["curricula"], response_class=FileResponse,
            responses={200: {"content": {PARQUET: {"schema": {"type": "string", "format": "binary"}}},
                             "description": "the stage's training subset as verl RLVR parquet"}})
def get_stage_subset(curriculum_id: Id, index: Annotated[int, Path(ge=0, le=MAX_STAGES)], request: Request) -> FileResponse:
    path = service(request).stage_subset(curriculum_id, index)
    return FileResponse(path, media_type=PARQUET, filename=f"{curriculum_id}-stage{index}.parquet")
