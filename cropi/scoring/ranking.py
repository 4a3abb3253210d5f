"""A ranking of a pool against validation sets: per-set scores, fused score, rank."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pyarrow as pa

from cropi.scoring.fusion import fuse, ranks
from cropi.scoring.influence import cosine_scores, validation_vector
from cropi.scoring.selection import select_top


@dataclass
class Ranking:
    prompt_ids: list[str]
    status: list[str]
    scores: dict[str, np.ndarray]     # validation set -> cosine per prompt
    fused: np.ndarray
    rank: np.ndarray                  # 1-based; 0 = not ranked
    meta: dict = field(default_factory=dict)

    @property
    def excluded(self) -> dict[str, int]:
        return dict(Counter(s for s in self.status if s != "ok"))

    def select(self, *, top_fraction: float | None = None, top_k: int | None = None) -> list[str]:
        return select_top(self.prompt_ids, self.fused, self.status, top_fraction=top_fraction, top_k=top_k)

    def to_table(self) -> pa.Table:
        """Rows in rank order (ranked prompts first, then the excluded ones by id)."""
        order = np.lexsort((np.asarray(self.prompt_ids, dtype=str), self.rank, self.rank == 0))
        cols = {"prompt_id": pa.array(self.prompt_ids).take(order),
                "status": pa.array(self.status).take(order),
                "rank": pa.array(self.rank[order]),
                "fused": pa.array(self.fused[order], from_pandas=True)}
        for name, s in self.scores.items():
            cols[f"score:{name}"] = pa.array(s[order], from_pandas=True)
        return pa.table(cols)

    @classmethod
    def from_table(cls, table: pa.Table, meta: dict | None = None) -> "Ranking":
        scores = {c.split(":", 1)[1]: _floats(table[c]) for c in table.column_names if c.startswith("score:")}
        return cls(table["prompt_id"].to_pylist(), table["status"].to_pylist(), scores,
                   _floats(table["fused"]), table["rank"].to_numpy(), meta or {})


def rank_pool(pool_ids, pool_vectors, pool_status, validation: Mapping[str, tuple], *,
              fusion: str = "rrf", max_validation: int = 100, seed: int = 0) -> Ranking:
    """Score a pool against each validation set, given as (prompt_ids, vectors, status)."""
    scores, used = {}, {}
    for name, (ids, vecs, status) in validation.items():
        target, used[name] = validation_vector(ids, vecs, status, max_prompts=max_validation, seed=seed)
        scores[name] = cosine_scores(pool_vectors, pool_status, target)
    fused = fuse(scores, pool_ids, fusion)
    meta = {"fusion": fusion, "max_validation": max_validation, "seed": seed,
            "validation_prompts": {k: len(v) for k, v in used.items()}}
    return Ranking(list(pool_ids), list(pool_status), scores, fused, ranks(fused, pool_ids), meta)


def _floats(col) -> np.ndarray:
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
