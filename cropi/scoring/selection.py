"""Pick the stage subset: top fraction or top-k by fused score, only ``ok`` prompts."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from cropi.errors import InvalidInputError
from cropi.scoring.fusion import order


def select_top(prompt_ids: Sequence[str], fused: np.ndarray, status: Sequence[str], *,
               top_fraction: float | None = None, top_k: int | None = None) -> list[str]:
    """Best prompts first. The fraction is of the whole pool (CROPI's 10% a stage);
    prompts whose status is not ``ok`` are never selected, so fewer may come back."""
    if (top_fraction is None) == (top_k is None):
        raise InvalidInputError("give exactly one of top_fraction or top_k")
    if top_fraction is not None and not 0 < top_fraction <= 1:
        raise InvalidInputError(f"top_fraction must be in (0, 1], got {top_fraction}")
    if top_k is not None and top_k < 1:
        raise InvalidInputError(f"top_k must be at least 1, got {top_k}")
    want = top_k if top_k is not None else math.ceil(top_fraction * len(prompt_ids))
    masked = np.where(np.asarray(status) == "ok", fused, np.nan)
    return [prompt_ids[i] for i in order(masked, prompt_ids)[:want]]
