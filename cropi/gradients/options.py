"""How the POPI loss is formed: the options every gradient step takes (torch-free)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LossOptions(BaseModel):
    """How the POPI loss is formed; recorded in every gradient manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    clip_eps: float | None = Field(None, gt=0, description="PPO ratio clip; None = unclipped (CROPI)")
    token_budget: int = Field(8192, gt=0, description="padded tokens per micro-batch")
    max_length: int | None = Field(None, gt=1, description="truncate sequences to this length")
