"""How the POPI loss is formed, and how the scored model runs: the options every gradient step takes
(torch-free)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LossOptions(BaseModel):
    """How the POPI loss is formed; recorded in every gradient manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    clip_eps: float | None = Field(None, gt=0, description="PPO ratio clip; None = unclipped (CROPI)")
    token_budget: int = Field(8192, gt=0, description="padded tokens per micro-batch")
    max_length: int | None = Field(None, gt=1, description="truncate sequences to this length")
    advantage: Literal["behavior", "theta"] = Field(
        "behavior", description="'behavior': CROPI's POPI, the behavior group's mean and std with token ratios; "
        "'theta': advantages from the importance-weighted pass rate and std at the current checkpoint, "
        "self-normalised sequence weights (popi.py)")

    def recorded(self) -> dict:
        """The options as manifests, setup hashes and resume keys record them: the estimator only
        when it is not CROPI's default, so what was stored before the choice existed still matches."""
        doc = self.model_dump()
        if self.advantage == type(self).model_fields["advantage"].default:
            doc.pop("advantage")
        return doc

    @model_validator(mode="after")
    def _clip_needs_token_ratios(self) -> "LossOptions":
        if self.clip_eps is not None and self.advantage == "theta":
            raise ValueError("clip_eps clips POPI's token ratios; the 'theta' estimator has none: "
                             "leave clip_eps unset or use advantage='behavior'")
        return self


ModelDtype = Literal["auto", "float32", "bfloat16", "float16"]
Attention = Literal["auto", "eager", "sdpa"]
# What "auto" resolves to on each device: float32 and eager attention on CPU (every result measured there,
# and what every store before these options holds); on CUDA bfloat16, what users' GPUs run, and sdpa, whose
# kernels the batched path needs for speed there (its hooks take no per-example gradients through torch.func,
# which eager attention was kept for). Measured: benchmarks/results/gpu/ (speed), the bfloat16 fidelity
# (benchmarks/fidelity.py --model-dtype bfloat16).
AUTO = {"cpu": ("float32", "eager"), "cuda": ("bfloat16", "sdpa")}
BASELINE = AUTO["cpu"]  # float32, eager: recorded as nothing, so stores made before the options still match


class ModelOptions(BaseModel):
    """How the scored model runs while its gradients are taken: its dtype and attention implementation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_dtype: ModelDtype = Field("auto", description="the model's dtype while scoring ('auto': float32 on CPU, "
                                    "bfloat16 on CUDA); projected sums accumulate in float32 either way")
    attention: Attention = Field("auto", description="attention implementation while scoring ('auto': eager on "
                                 "CPU, sdpa on CUDA)")
    checkpoint_layers: bool = Field(False, description="batched kinds: run each decoder layer under activation "
                                    "checkpointing (one more forward, one layer's activations held instead of all: "
                                    "for a micro-batch the device has no memory for); the vectors are the same")

    def resolve(self, device: str) -> tuple[str, str]:
        """(dtype, attention) on ``device`` (a resolved torch device string: 'cpu', 'cuda', 'cuda:1')."""
        auto = AUTO["cuda" if str(device).startswith("cuda") else "cpu"]
        return (auto[0] if self.model_dtype == "auto" else self.model_dtype,
                auto[1] if self.attention == "auto" else self.attention)

    def recorded(self, device: str) -> dict:
        """What a gradient store's identity records of them on ``device``: nothing for float32 with eager
        attention (what every store held before the options existed, so such a job resumes them), else the
        resolved dtype and attention (vectors of a bfloat16 model are never mixed with float32 ones). Not
        ``checkpoint_layers``: it changes what a pass holds, not what it computes."""
        dtype, attention = self.resolve(device)
        return {} if (dtype, attention) == BASELINE else {"model_dtype": dtype, "attention": attention}


def recorded_run(record: dict | None) -> tuple[str, str]:
    """(dtype, attention) the model ran in for a store whose identity records ``record`` (``ModelOptions.
    recorded``; nothing: float32 with eager attention), on whatever device reads it."""
    return (record["model_dtype"], record["attention"]) if record else BASELINE
