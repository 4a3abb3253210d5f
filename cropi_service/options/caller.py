"""The options a caller may choose, derived from the library's options models (see ``derive``).

Nothing here restates a library field: each model below is the library's, with this service's
policy on top: what a caller may not set, free-form fields it vets, and the tighter bounds of a
shared server (fewer samples, shorter contexts, no engine setting that picks the model or loads
code). The model is always the registered checkpoint folder, and remote code is never trusted.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from annotated_types import Ge, Le, MaxLen
from pydantic import AfterValidator, Field, StringConstraints

from cropi.generation.options import CollectOptions, EngineOptions
from cropi.gradients.options import LossOptions
from cropi.pipeline.curriculum.check import CheckOptions
from cropi.pipeline.curriculum.config import CurriculumConfig
from cropi.pipeline.requests import RefreshOptions, ScoreRequest
from cropi.projection.spec import ProjectionSpec
from cropi.trainers.trl import NAME as TRL, TrlOptions
from cropi.trainers.verl_overrides import NAME as VERL, VerlOptions

from .derive import Policy, caller_model, library_field

# a shared server's limits
MAX_SAMPLES = 256  # responses per prompt (the library allows 4096 for its sampler's statistical checks)
MAX_STAGES = 100  # stages of one curriculum (the library allows cropi.pipeline.curriculum.config.MAX_STAGES)
MAX_CONTEXT = 131_072  # tokens of prompt and response
SEED = (Le(2**31 - 1),)
SAMPLES = (Le(MAX_SAMPLES),)
CONTEXT = (Le(MAX_CONTEXT),)
BATCH = (Le(65_536),)
REGEX = (MaxLen(256),)  # parameter-name patterns: short, so matching them stays cheap
DEVICE = (StringConstraints(pattern=r"^(auto|cpu|cuda(:[0-9]{1,2})?)$"),)
SPLIT_SETTER = "the service sets it from the request (path, pool, validation, trajectories, projection)"


def _registered_reward(name: str) -> str:
    from cropi.rewards import available_rewards  # torch-free, registers the built-ins

    if name not in available_rewards():
        raise ValueError(f"unknown reward {name!r}; registered: {available_rewards()}")
    return name


REWARD = (StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$"), AfterValidator(_registered_reward))

Projection = caller_model(ProjectionSpec, Policy(
    vetted={"include": REGEX, "exclude": REGEX},
    tighter={"dim": (Le(1 << 17),), "nnz": (Le(64),), "identity_limit": (Le(1 << 24),)}), name="Projection")

Loss = caller_model(LossOptions, Policy(
    tighter={"clip_eps": (Le(10),), "token_budget": (Ge(64), Le(1 << 20)), "max_length": CONTEXT}), name="Loss")

Engine = caller_model(EngineOptions, Policy(
    tighter={"max_batch_rows": (Le(4096),), "max_model_len": (Ge(16), *CONTEXT),
             "gpu_memory_utilization": (Le(0.95),)}), name="Engine")

Collect = caller_model(CollectOptions, Policy(
    vetted={"reward": REWARD},
    tighter={"pool_samples": SAMPLES, "validation_samples": SAMPLES, "temperature": (Le(2),), "seed": SEED,
             "batch_prompts": (Le(4096),)},
    nested={"engine": Engine}), name="Collect")

Refresh = caller_model(RefreshOptions, Policy(), name="Refresh")
Check = caller_model(CheckOptions, Policy(), name="Check")  # numbers, flags and a selector's name: all closed

ScoringOptions = caller_model(ScoreRequest, Policy(
    refused={**dict.fromkeys(("name", "model", "pool", "validation", "trajectories", "projection"), SPLIT_SETTER),
             "behavior": "the service collects with the registered checkpoint"},
    vetted={"device": DEVICE},
    tighter={"max_validation": (Le(100_000),), "seed": SEED},
    nested={"loss": Loss, "collect": Collect}), name="ScoringOptions")

GRPO_BOUNDS = {"lr": (Le(1),), "batch_prompts": BATCH, "rollouts": SAMPLES, "kl_coef": (Le(100),),
               "max_prompt_tokens": CONTEXT, "max_new_tokens": (Le(32_768),), "temperature": (Le(2),),
               "weight_decay": (Le(10),), "grad_clip": (Le(1e6),)}

TrlTraining = caller_model(TrlOptions, Policy(tighter={**GRPO_BOUNDS, "micro_batch": BATCH}), name="TrlTraining",
                           extra={"name": (Literal[TRL], ...)})

# No interpreter, run folder, extra Hydra overrides or loggers (free-form: refused without a word
# here): those are the operator's, they run programs and write or send data where they say.
VerlTraining = caller_model(VerlOptions, Policy(tighter={
    **GRPO_BOUNDS, "entropy_coeff": (Le(10),), "mini_batch_prompts": BATCH, "micro_batch_per_gpu": (Le(4096),),
    "n_gpus_per_node": (Le(64),), "nnodes": (Le(1024),), "tensor_parallel": (Le(64),),
    "gpu_memory_utilization": (Le(0.95),), "save_freq": (Le(1_000_000),), "test_freq": (Le(1_000_000),)}),
    name="VerlTraining", extra={"name": (Literal[VERL], ...)})

CurriculumOptions = caller_model(CurriculumConfig, Policy(
    refused={**dict.fromkeys(("name", "model", "pool", "validation", "projection"), SPLIT_SETTER),
             "stages": "give it as the request's `stages`", "select_fraction": "give it as the request's `fraction`",
             "trainer_options": "give them in `trainer` with its name: {\"name\": \"trl\", ...}"},
    vetted={"reward": REWARD, "device": DEVICE},
    tighter={"steps_per_stage": (Le(1_000_000),), "seed": SEED, "max_validation": (Le(100_000),)},
    nested={"collect": Collect, "loss": Loss, "refresh": Refresh, "check": Check,
            "trainer": Annotated[Union[TrlTraining, VerlTraining], Field(discriminator="name")]}),
    name="CurriculumOptions")

# A curriculum request carries two library fields beside its options: ``stages``, and ``fraction`` (a
# name the library accepts for its ``select_fraction``). Their type, bounds and description are the library's.
Stages = library_field(CurriculumConfig, "stages", Le(MAX_STAGES), name="stages")
Fraction = library_field(CurriculumConfig, "select_fraction", name="fraction")

__all__ = ["Check", "Collect", "CurriculumOptions", "Engine", "Fraction", "Loss", "Projection", "Refresh", "ScoringOptions",
           "Stages", "TrlTraining", "VerlTraining"]
