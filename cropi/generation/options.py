"""How trajectories are collected: every collection default and constraint, spelled once.

CROPI's setup: K = 8 responses per pool prompt, K = 32 per validation prompt,
temperature 0.5, top-p 1. The CLI, the service, the curriculum, jobs/ and the demo
all take these models, so a default or a bound changes here and nowhere else.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from cropi.contracts import Backend

K_POOL = 8
K_VALIDATION = 32
MAX_SAMPLES = 4096  # leaves room for statistical checks of the sampler (thousands of one-token draws)
MAX_NEW_TOKENS = 32768
DEFAULT_REWARD = "math_verify"


class SamplingConfig(BaseModel):
    """How responses are sampled. CROPI: K=8 (32 for validation prompts), temperature 0.5."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: int = Field(K_POOL, gt=0, le=MAX_SAMPLES, description="K: responses per prompt")
    temperature: float = Field(0.5, ge=0.0, le=100.0, description="sampling temperature; 0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    max_new_tokens: int = Field(256, gt=0, le=MAX_NEW_TOKENS, description="longest response, in tokens")
    seed: int = Field(0, ge=0, description="run seed; each prompt's seed derives from it and its id")


class EngineOptions(BaseModel):
    """Engine settings a caller may choose: a closed list, none of which picks the model,
    trusts remote code or changes the attention implementation. Unset means the engine's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_rows: Optional[int] = Field(None, gt=0, le=1 << 16, description="hf: responses decoded together")
    tensor_parallel_size: Optional[int] = Field(None, ge=1, le=64, description="vllm: GPUs per engine")
    max_model_len: Optional[int] = Field(None, gt=0, le=1 << 20, description="vllm: longest prompt + response")
    gpu_memory_utilization: Optional[float] = Field(None, gt=0, le=1, description="vllm: GPU memory share")
    enforce_eager: Optional[bool] = Field(None, description="vllm: no CUDA graphs")

    HF_FIELDS: ClassVar[tuple[str, ...]] = ("max_batch_rows",)

    def for_backend(self, backend: str) -> dict:
        """The set options as keyword arguments of ``backend``; refuses options of the other engine."""
        given = self.model_dump(exclude_none=True)
        own = set(self.HF_FIELDS) if backend == "hf" else set(type(self).model_fields) - set(self.HF_FIELDS)
        foreign = sorted(set(given) - own)
        if foreign:
            raise ValueError(f"engine options {foreign} do not apply to the {backend!r} backend; "
                             f"it takes {sorted(own)}")
        return given


class CollectOptions(BaseModel):
    """How missing trajectories are collected: one engine, one reward, K per split kind.

    ``backend_options`` is accepted for ``engine`` (configs written before the rename).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    backend: Backend = Field("vllm", description="generation engine")
    reward: str = Field(DEFAULT_REWARD, min_length=1, description="verifiable reward, by registered name")
    pool_samples: int = Field(K_POOL, gt=0, le=MAX_SAMPLES, description="K for pool prompts")
    validation_samples: int = Field(K_VALIDATION, gt=0, le=MAX_SAMPLES, description="K for validation prompts")
    temperature: float = SamplingConfig.model_fields["temperature"]
    top_p: float = SamplingConfig.model_fields["top_p"]
    max_new_tokens: int = SamplingConfig.model_fields["max_new_tokens"]
    seed: int = SamplingConfig.model_fields["seed"]
    # The default is part of every stored curriculum's resume key: raise it per run on a GPU (256 or more).
    batch_prompts: int = Field(32, gt=0, le=1 << 16, description="prompts generated (and committed) at once")
    engine: EngineOptions = Field(EngineOptions(), validation_alias=AliasChoices("engine", "backend_options"))

    @model_validator(mode="after")
    def _engine_fits_backend(self) -> "CollectOptions":
        self.engine.for_backend(self.backend)  # refused here, before any work, not when the engine starts
        return self

    def sampling(self, samples: int) -> SamplingConfig:
        return SamplingConfig(samples=samples, temperature=self.temperature, top_p=self.top_p,
                              max_new_tokens=self.max_new_tokens, seed=self.seed)

