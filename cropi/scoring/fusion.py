"""Ranks and fusion of per-validation-set scores.

Ranks are 1-based over the scored (finite) prompts, higher score first, ties broken
by ``prompt_id`` so a ranking is the same on every run. Reciprocal-rank fusion is
``sum_j 1 / (c + rank_j)`` (CROPI: c = 0); ``max`` takes the best cosine.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from cropi.contracts import FUSIONS
from cropi.errors import InvalidInputError



def order(scores: np.ndarray, prompt_ids: Sequence[str]) -> np.ndarray:
    """Indices of finite scores, best first, ties by prompt_id."""
    finite = np.flatnonzero(np.isfinite(scores))
    ids = np.asarray(prompt_ids, dtype=str)[finite]
    return finite[np.lexsort((ids, -scores[finite]))]


def ranks(scores: np.ndarray, prompt_ids: Sequence[str]) -> np.ndarray:
    """1-based rank per prompt (0 where the score is not finite)."""
    out = np.zeros(len(scores), dtype=np.int64)
    out[order(scores, prompt_ids)] = np.arange(1, int(np.isfinite(scores).sum()) + 1)
    return out


def fuse(per_set: Mapping[str, np.ndarray], prompt_ids: Sequence[str], method: str = "rrf",
         rrf_c: float = 0.0) -> np.ndarray:
    """Fused score per prompt; NaN where any set left it unscored."""
    if method not in FUSIONS:
        raise InvalidInputError(f"unknown fusion {method!r}: choose one of {', '.join(FUSIONS)}")
    if not per_set:
        raise InvalidInputError("no validation scores to fuse: name at least one validation set")
    stacked = np.stack(list(per_set.values()))
    valid = np.all(np.isfinite(stacked), axis=0)
    if method == "max":
        fused = np.max(np.where(valid, stacked, -np.inf), axis=0)
    else:
        fused = sum(1.0 / (rrf_c + np.maximum(ranks(s, prompt_ids), 1)) for s in stacked)
    return np.where(valid, fused, np.nan)
