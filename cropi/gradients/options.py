"""How the POPI loss is formed: the options every gradient step takes (torch-free)."""

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
