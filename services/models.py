"""Request and response bodies of the v1 API (their JSON schemas make the OpenAPI document)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Dataset and checkpoint names become split names, column names and path components in the store.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Name = Field(pattern=NAME_PATTERN, description="letters, digits, '_', '.', '-'; at most 64; starts alphanumeric")
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
MAX_BATCH = 10_000


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. not_found, path_outside_roots")
    message: str = Field(description="what is wrong and what to do")


class ErrorResponse(BaseModel):
    error: ErrorBody


class Health(BaseModel):
    status: Literal["ok"]
    version: str


# datasets

class DatasetCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, description="prompt file (jsonl, parquet or verl parquet) under a data root")
    kind: Literal["pool", "validation"]


class Dataset(BaseModel):
    id: str
    name: str
    path: str
    kind: Literal["pool", "validation"]
    n_prompts: int
    created: float


class DatasetList(BaseModel):
    items: list[Dataset]


# jobs

class Progress(BaseModel):
    stage: str
    done: int
    total: int


class JobView(BaseModel):
    id: str
    kind: str
    state: JobState
    progress: Progress | None = None
    error: ErrorBody | None = None
    result: dict[str, Any] | None = None
    attempts: int
    created: float
    updated: float


# checkpoints

class CheckpointCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, description="model folder (Hugging Face layout) under a data root")
    pool: str = Field(description="id of a dataset registered with kind=pool")
    validation: list[str] = Field(min_length=1, max_length=16, description="ids of validation datasets")
    trajectories: dict[str, str] | None = Field(
        default=None, description="split name (pool dataset name or validation dataset name) -> trajectory "
                                  "directory under a data root; omitted splits are collected")
    projection: dict[str, Any] | None = Field(default=None, description="cropi ProjectionSpec fields; default spec if omitted")
    options: dict[str, Any] | None = Field(default=None, description="further ScoringRequest fields (collect, loss options)")


class CheckpointCreated(BaseModel):
    id: str
    job_id: str


class Checkpoint(BaseModel):
    id: str
    name: str
    path: str
    pool: str
    validation: list[str]
    spec_id: str | None
    job: JobView
    created: float


class RankedPrompt(BaseModel):
    position: int = Field(description="1-based place in this listing's order")
    prompt_id: str
    rank: int = Field(description="1-based rank by fused score")
    fused: float | None
    scores: dict[str, float | None] = Field(description="cosine influence per validation set")
    selected: bool | None = None


class RankingPage(BaseModel):
    checkpoint: str
    spec_id: str | None
    order: str = Field(description="'fused' or the validation set the page is sorted by")
    total: int = Field(description="ranked prompts (excluded ones not counted)")
    offset: int
    limit: int
    items: list[RankedPrompt]
    excluded: dict[str, int] = Field(description="prompts left out of the ranking, counted by status")


# gradients

class GradientRecord(BaseModel):
    prompt_id: str
    vector: list[float]
    raw_norm: float | None = None
    n_responses: int | None = None
    reward_mean: float | None = None
    reward_std: float | None = None
    n_tokens: int | None = None
    status: str | None = None


class GradientBatch(BaseModel):
    checkpoint: str
    spec_id: str | None
    split: str
    dim: int
    items: list[GradientRecord]


class GradientBatchRequest(Strict):
    prompt_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)
    split: str | None = Field(default=None, description="store split (default: the pool's)")


# curricula

class CurriculumCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, description="initial model folder under a data root")
    pool: str = Field(description="id of a pool dataset")
    validation: list[str] = Field(min_length=1, max_length=16)
    stages: int = Field(default=3, ge=1, le=100)
    fraction: float = Field(default=0.1, gt=0, le=1, description="share of the pool selected per stage")
    projection: dict[str, Any] | None = None
    options: dict[str, Any] | None = Field(default=None, description="further CurriculumConfig fields")


class CurriculumCreated(BaseModel):
    id: str
    job_id: str


class Stage(BaseModel):
    index: int
    n_prompts: int | None = None
    checkpoint: str | None = None
    subset_url: str | None = Field(default=None, description="GET this for the stage's verl parquet")


class Curriculum(BaseModel):
    id: str
    name: str
    job: JobView
    stages: list[Stage]
    created: float
