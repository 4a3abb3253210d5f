"""Response bodies of the v1 API, and the one request body the domain does not take (their JSON schemas
make the OpenAPI document; the POST bodies that start work are ``options.requests``)."""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from cropi.contracts import NAME_MAX

from ..jobs.table import STATES
from ..options.requests import Strict

JobState = Literal[STATES]
MAX_BATCH = 10_000
PROMPT_ID_MAX = 1024
PAGE_DEFAULT, PAGE_MAX, OFFSET_MAX = 100, 10_000, 2**31  # ranking pages
LIST_DEFAULT, LIST_MAX = 100, 1000  # pages of registered datasets and checkpoints


class ErrorBody(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. not_found, path_outside_roots")
    message: str = Field(description="what is wrong and what to do")


class ErrorResponse(BaseModel):
    error: ErrorBody


class Health(BaseModel):
    status: Literal["ok"]
    version: str


# datasets

class Dataset(BaseModel):
    id: str
    name: str
    path: str
    kind: Literal["pool", "validation"]
    n_prompts: int
    created: float


Entry = TypeVar("Entry")


class Page(BaseModel, Generic[Entry]):
    """One page of a registry's entries (datasets, checkpoints): ``?offset=&limit=`` pick it."""

    items: list[Entry] = Field(description="oldest first")
    total: int = Field(description="entries registered")
    offset: int
    limit: int


class DatasetList(Page[Dataset]):
    """A page of the registered datasets."""


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

class CheckpointCreated(BaseModel):
    id: str
    job_id: str


class CheckpointSummary(BaseModel):
    id: str
    name: str
    path: str
    pool: str
    validation: list[str]
    spec_id: str | None
    job_id: str = Field(description="its scoring job: GET /v1/jobs/{job_id} for its state")
    created: float


class CheckpointList(Page[CheckpointSummary]):
    """A page of the registered checkpoints."""


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
    selection: dict | None = Field(None, description="the selection's mix against the pool (cropi.scoring."
                                   "diagnostics.selection_mix): per data_source the pool and selected shares and "
                                   "the modal answer's share in each, and warnings such as label_skew or silent_validation_set (a "
                                   "validation set without one ok prompt, ranked without); null for rankings stored "
                                   "before it")


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
    ess: float | None = Field(None, description="effective sample size of the prompt's K importance weights "
                              "(current policy over behavior); null when unknown or stored without it")
    ess_fraction: float | None = Field(None, description="ESS / K, in (0, 1]: low means the reused "
                                       "trajectories no longer represent the policy; null when unknown")
    p_theta: float | None = Field(None, description="pass rate at the checkpoint: the self-normalised "
                                  "importance-weighted mean of the K rewards (the plain mean at the behavior "
                                  "policy); null when unknown or stored without it")
    std_theta: float | None = Field(None, description="reward standard deviation at the checkpoint, weighted as "
                                    "p_theta (the biased one: sqrt(sum w (R - p_theta)^2 / sum w)); null when "
                                    "unknown or stored without it")
    log_mean_weight: float | None = Field(None, description="log of the mean sequence importance weight "
                                          "(checkpoint over behavior) of the K responses: 0 at the behavior "
                                          "policy, moving (mostly down) as the checkpoint leaves it, even where "
                                          "every reward is equal; null when unknown or stored without it")


class GradientBatch(BaseModel):
    checkpoint: str
    spec_id: str | None
    split: str
    dim: int
    items: list[GradientRecord]


class GradientBatchRequest(Strict):
    prompt_ids: list[Annotated[str, Field(max_length=PROMPT_ID_MAX)]] = Field(min_length=1, max_length=MAX_BATCH)
    split: str | None = Field(default=None, max_length=NAME_MAX, description="store split (default: the pool's)")


# curricula

class CurriculumCreated(BaseModel):
    id: str
    job_id: str


class Stage(BaseModel):
    index: int
    n_prompts: int | None = None
    checkpoint: str | None = None
    subset_url: str | None = Field(default=None, description="GET this for the stage's verl parquet")
    checks: dict | None = Field(default=None, description="the stage's checks of its own effect on the validation "
                                "sets: each check's objective, SE, margin and action, a race's lead and whether its SE "
                                "resolves it (race_lead; with check.race_length: sequential the lead at half a part, race_first_look, and where it was not resolved each arm's other half, race_on (with check.race_futility: stop not where the higher half read at or below the stage's start, race_first_look.futile; with check.race_efficacy: stop not where the higher half's gain over the start was resolved there, race_first_look.gain and gained; with check.race_gain_length: sequential where the lead was resolved but the winner's gain over the start was above zero and not, the winner's other half alone, race_on, and that gain, race_gain_look); with check.race_unresolved: fallback a race that could not tell its arms apart, race_unresolved: the arm that went on, the higher reading's arm and lead; with check.race_sample: rest each race entry's reading on every validation prompt not held out to confirm a fall, race_values, race_objective, race_draws; with check.race_no_gain restart or pool the stage's start read on that sample and the winner's gain over it, race_start (no_gain: a gain check.race_gain does not count), the whole pool going on where there is none, from the best checkpoint under restart, under higher from the winner's where the race read it above the start, from_winner, widened_by no_gain), with check.widen_check: race each widening race (widen_races: the "
                                "current and doubled fraction, the winner, its lead), with check.widen_when: stalled a saturated "
                                "part's rise over the best and whether it is resolved (rising), with check.widened: no_harm "
                                "how many pool prompts of negative gain a widened subset left out (negative), the stage's case(s), or why "
                                "it ran unchecked (cropi.pipeline.curriculum.state.check_summary)")
    warnings: list[dict] | None = Field(default=None, description="what the stage subset's record warns of (each "
                                        "with its code and message: concentrated_selection, label_skew, field_skew, "
                                        "filled_to_batch, silent_validation_set, ranking_turned_over; "
                                        "cropi.scoring.diagnostics)")
    ranking_change: dict | None = Field(default=None, description="the stage's influence ranking against the last "
                                        "stage's: Spearman over the prompts both ranked, its z against 0, the top "
                                        "selection's overlap beside a random order's (cropi.scoring.diagnostics."
                                        "ranking_change); none at the first stage or without a ranking")
    cost_s: dict | None = Field(default=None, description="the stage's seconds: scoring, checks, training, and "
                                "apart from them evaluation, the trainer's test-split evaluations that training "
                                "leaves out (cropi.pipeline.curriculum.state.stage_cost)")


class Curriculum(BaseModel):
    id: str
    name: str
    job: JobView
    stages: list[Stage]
    created: float
