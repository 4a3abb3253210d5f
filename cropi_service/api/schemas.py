"""Request and response bodies of the v1 API (their JSON schemas make the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Dataset and checkpoint names become split names, column names and path components in the store.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Name = Field(pattern=NAME_PATTERN, description="letters, digits, '_', '.', '-'; at most 64; starts alphanumeric")
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
MAX_BATCH = 10_000
PAGE_DEFAULT, PAGE_MAX, OFFSET_MAX, NAME_MAX = 100, 10_000, 2**31, 64  # ranking pages and query names
MAX_PATH = 4096  # PATH_MAX on Linux
Path_ = Field(min_length=1, max_length=MAX_PATH)
MAX_SAMPLES = 256
MAX_NEW_TOKENS = 32_768
MAX_CONTEXT = 131_072


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
    path: str = Field(min_length=1, max_length=MAX_PATH, description="prompt file (jsonl, parquet or verl parquet) under a data root")
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


# options a caller may choose: closed models with bounds, built field by field into the library's
# requests (services/options.py). Nothing here names a model, a file to load code from, or passes a
# dict on to an engine: the model is always the registered checkpoint folder, remote code is never
# trusted, and engine arguments are the few named below. None means "the library's default".

class Projection(Strict):
    """The projection spec (cropi ProjectionSpec), with bounds a shared service needs."""

    kind: Optional[Literal["sjlt", "gaussian", "rademacher", "identity"]] = None
    dim: Optional[int] = Field(default=None, ge=1, le=1 << 17, description="projected dimension k")
    kept_fraction: Optional[float] = Field(default=None, gt=0, le=1)
    seed: Optional[int] = Field(default=None, ge=0, le=2**63 - 1)
    nnz: Optional[int] = Field(default=None, ge=1, le=64)
    include: Optional[str] = Field(default=None, max_length=256, description="regex over parameter names")
    exclude: Optional[str] = Field(default=None, max_length=256, description="regex over parameter names")
    identity_limit: Optional[int] = Field(default=None, ge=1, le=1 << 24)


class Sampling(Strict):
    samples: Optional[int] = Field(default=None, ge=1, le=MAX_SAMPLES, description="K: responses per prompt")
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    max_new_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    seed: Optional[int] = Field(default=None, ge=0, le=2**31 - 1)


class Engine(Strict):
    """The generation engine settings a caller may set: the library's closed ``EngineOptions``
    (cropi.generation.options), nothing that picks the model or loads code."""

    max_batch_rows: Optional[int] = Field(default=None, ge=1, le=4096, description="hf only")
    tensor_parallel_size: Optional[int] = Field(default=None, ge=1, le=64, description="vllm only")
    max_model_len: Optional[int] = Field(default=None, ge=16, le=MAX_CONTEXT, description="vllm only")
    gpu_memory_utilization: Optional[float] = Field(default=None, gt=0, le=0.95, description="vllm only")
    enforce_eager: Optional[bool] = Field(default=None, description="vllm only")

    def arguments(self, backend: str) -> dict[str, Any]:
        """The backend's keyword arguments: the named fields the caller set, nothing else."""
        chosen = self.model_dump(exclude_none=True)
        foreign = sorted(set(chosen) - ENGINE_FIELDS[backend])
        if foreign:
            raise ValueError(f"engine options {foreign} do not apply to the {backend!r} backend; "
                             f"it takes {sorted(ENGINE_FIELDS[backend])}")
        return chosen


ENGINE_FIELDS = {"vllm": {"tensor_parallel_size", "max_model_len", "gpu_memory_utilization", "enforce_eager"},
                 "hf": {"max_batch_rows"}}
DEFAULT_BACKEND = "vllm"  # the library's default (cropi CollectOptions); only used to check engine fields early


def engine_arguments(backend: Optional[str], engine: Optional[Engine]) -> dict[str, Any]:
    return (engine or Engine()).arguments(backend or DEFAULT_BACKEND)


def _registered_reward(name: Optional[str]) -> Optional[str]:
    from cropi.rewards import available_rewards  # torch-free, registers the built-ins

    if name is not None and name not in available_rewards():
        raise ValueError(f"unknown reward {name!r}; registered: {available_rewards()}")
    return name


Reward = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,63}$", description="a registered cropi reward name")


class Collect(Strict):
    """How missing trajectories are collected for a checkpoint's scoring."""

    backend: Optional[Literal["vllm", "hf"]] = None
    reward: Optional[str] = Reward
    pool: Optional[Sampling] = None
    validation: Optional[Sampling] = None
    engine: Optional[Engine] = None

    _reward = field_validator("reward")(classmethod(lambda cls, v: _registered_reward(v)))

    @model_validator(mode="after")
    def _engine_fits(self) -> "Collect":
        engine_arguments(self.backend, self.engine)
        return self


class Loss(Strict):
    clip_eps: Optional[float] = Field(default=None, gt=0, le=10, description="PPO ratio clip; unset = unclipped")
    token_budget: Optional[int] = Field(default=None, ge=64, le=1 << 20, description="padded tokens per micro-batch")
    max_length: Optional[int] = Field(default=None, ge=2, le=MAX_CONTEXT)


Fusion = Literal["rrf", "max"]
GradientDtype = Literal["float16", "float32"]


class ScoringOptions(Strict):
    collect: Optional[Collect] = None
    loss: Optional[Loss] = None
    fusion: Optional[Fusion] = None
    top_fraction: Optional[float] = Field(default=None, gt=0, le=1, description="share of the pool marked selected")
    max_validation: Optional[int] = Field(default=None, ge=1, le=100_000, description="validation prompts per set")
    dtype: Optional[GradientDtype] = None


class CurriculumCollect(Strict):
    """How a curriculum's offline trajectories are sampled."""

    backend: Optional[Literal["vllm", "hf"]] = None
    pool_samples: Optional[int] = Field(default=None, ge=1, le=MAX_SAMPLES)
    validation_samples: Optional[int] = Field(default=None, ge=1, le=MAX_SAMPLES)
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    max_new_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    seed: Optional[int] = Field(default=None, ge=0, le=2**31 - 1)
    batch_prompts: Optional[int] = Field(default=None, ge=1, le=4096)
    engine: Optional[Engine] = None

    @model_validator(mode="after")
    def _engine_fits(self) -> "CurriculumCollect":
        engine_arguments(self.backend, self.engine)
        return self


class Grpo(Strict):
    """GRPO settings both trainers share."""

    lr: Optional[float] = Field(default=None, gt=0, le=1)
    batch_prompts: Optional[int] = Field(default=None, ge=1, le=65_536)
    rollouts: Optional[int] = Field(default=None, ge=2, le=MAX_SAMPLES)
    kl_coef: Optional[float] = Field(default=None, ge=0, le=100)
    max_prompt_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_CONTEXT)
    max_new_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    temperature: Optional[float] = Field(default=None, gt=0, le=2)
    weight_decay: Optional[float] = Field(default=None, ge=0, le=10)
    grad_clip: Optional[float] = Field(default=None, gt=0, le=1e6)


class TrlTraining(Grpo):
    """The in-process trl trainer."""

    name: Literal["trl"]
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    micro_batch: Optional[int] = Field(default=None, ge=1, le=65_536)
    loss_type: Optional[Literal["dapo", "grpo", "dr_grpo", "bnpo"]] = None
    carry_optimizer: Optional[bool] = None


class VerlTraining(Grpo):
    """verl GRPO runs. No interpreter, run folder, extra Hydra overrides or loggers: those are the
    operator's (they run programs and write or send data where the caller says)."""

    name: Literal["verl"]
    kl_loss_type: Optional[Literal["kl", "abs", "mse", "low_var_kl", "full"]] = None
    entropy_coeff: Optional[float] = Field(default=None, ge=0, le=10)
    rollout_name: Optional[Literal["vllm", "sglang"]] = None
    mini_batch_prompts: Optional[int] = Field(default=None, ge=1, le=65_536)
    micro_batch_per_gpu: Optional[int] = Field(default=None, ge=1, le=4096)
    n_gpus_per_node: Optional[int] = Field(default=None, ge=1, le=64)
    nnodes: Optional[int] = Field(default=None, ge=1, le=1024)
    tensor_parallel: Optional[int] = Field(default=None, ge=1, le=64)
    gpu_memory_utilization: Optional[float] = Field(default=None, gt=0, le=0.95)
    save_freq: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    test_freq: Optional[int] = Field(default=None, ge=-1, le=1_000_000)
    val_before_train: Optional[bool] = None


class CurriculumOptions(Strict):
    method: Optional[Literal["cropi", "full", "random", "pass_rate"]] = None
    trainer: Optional[Union[TrlTraining, VerlTraining]] = Field(default=None, discriminator="name")
    steps_per_stage: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    seed: Optional[int] = Field(default=None, ge=0, le=2**31 - 1)
    reward: Optional[str] = Reward
    collect: Optional[CurriculumCollect] = None
    recollect_each_stage: Optional[bool] = None
    loss: Optional[Loss] = None
    fusion: Optional[Fusion] = None
    max_validation: Optional[int] = Field(default=None, ge=1, le=100_000)
    gradient_dtype: Optional[GradientDtype] = None
    device: Optional[Literal["auto", "cpu", "cuda"]] = None

    _reward = field_validator("reward")(classmethod(lambda cls, v: _registered_reward(v)))


# checkpoints

class CheckpointCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, max_length=MAX_PATH,
                      description="model folder (Hugging Face layout) under a data root")
    pool: str = Field(max_length=64, description="id of a dataset registered with kind=pool")
    validation: list[Annotated[str, Field(max_length=64)]] = Field(min_length=1, max_length=16,
                                                                   description="ids of validation datasets")
    trajectories: Optional[dict[Annotated[str, Field(max_length=64)], Annotated[str, Path_]]] = Field(
        default=None, max_length=17,
        description="split name (pool dataset name or validation dataset name) -> trajectory "
                    "directory under a data root; omitted splits are collected")
    projection: Optional[Projection] = Field(default=None, description="projection spec; default spec if omitted")
    options: Optional[ScoringOptions] = Field(default=None, description="collection, loss and ranking options")


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
    ess: float | None = Field(None, description="effective sample size of the prompt's K importance weights "
                              "(current policy over behavior); null when unknown or stored without it")
    ess_fraction: float | None = Field(None, description="ESS / K, in (0, 1]: low means the reused "
                                       "trajectories no longer represent the policy; null when unknown")


class GradientBatch(BaseModel):
    checkpoint: str
    spec_id: str | None
    split: str
    dim: int
    items: list[GradientRecord]


class GradientBatchRequest(Strict):
    prompt_ids: list[Annotated[str, Field(max_length=1024)]] = Field(min_length=1, max_length=MAX_BATCH)
    split: str | None = Field(default=None, max_length=64, description="store split (default: the pool's)")


# curricula

class CurriculumCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, max_length=MAX_PATH, description="initial model folder under a data root")
    pool: str = Field(max_length=64, description="id of a pool dataset")
    validation: list[Annotated[str, Field(max_length=64)]] = Field(min_length=1, max_length=16)
    stages: int = Field(default=3, ge=1, le=100)
    fraction: float = Field(default=0.1, gt=0, le=1, description="share of the pool selected per stage")
    projection: Optional[Projection] = None
    options: Optional[CurriculumOptions] = Field(default=None, description="method, trainer and collection options")


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
