"""A ranking of a pool against validation sets: per-set scores, fused score, rank."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pyarrow as pa

from cropi.scoring.diagnostics import SILENT_VALIDATION
from cropi.scoring.fusion import fuse, ranks
from cropi.scoring.influence import (NO_SIGNAL_HELP, cosine_scores, no_signal_error, silent_sets,
                                     validation_vector)
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
              fusion: str = "rrf", max_validation: int = 100, seed: int = 0,
              groups: Mapping[str, Mapping[str, str]] | None = None) -> Ranking:
    """Score a pool against each validation set, given as (prompt_ids, vectors, status).

    With ``groups`` (set -> prompt_id -> label, e.g. its answer), each set is split by label
    and every group gets its own mean vector and score column ``<set>[<label>]``, all fused
    together: the selection then draws from every label's best prompts instead of those of
    whichever label dominates the set's mean (cropi.scoring.diagnostics: label skew).
    """
    if groups:
        validation = split_by_label(validation, groups)
    silent = silent_sets({name: list(status) for name, (_, _, status) in validation.items()})
    if len(silent) == len(validation):
        raise no_signal_error(silent)
    scores, used = {}, {}
    for name, (ids, vecs, status) in validation.items():
        if name in silent:
            continue
        target, used[name] = validation_vector(ids, vecs, status, max_prompts=max_validation, seed=seed)
        scores[name] = cosine_scores(pool_vectors, pool_status, target)
    fused = fuse(scores, pool_ids, fusion)
    meta = {"fusion": fusion, "max_validation": max_validation, "seed": seed,
            "validation_prompts": {k: len(v) for k, v in used.items()}}
    if silent:
        meta["silent_validation"] = silent
        meta["warnings"] = [silent_warning(silent, sorted(scores))]
    return Ranking(list(pool_ids), list(pool_status), scores, fused, ranks(fused, pool_ids), meta)


def silent_warning(silent: Mapping[str, Mapping[str, int]], ranked_on: list[str]) -> dict:
    """The ranking's warning that it left out the silent validation sets (``silent_sets``)."""
    return {"code": SILENT_VALIDATION, "sets": sorted(silent), "ranked_on": ranked_on,
            "message": f"validation set(s) {', '.join(sorted(silent))} have no prompt with status 'ok', so their "
                       f"gradient is zero and they add nothing to any prompt's influence: ranked on "
                       f"{', '.join(ranked_on)} alone. To target them, {NO_SIGNAL_HELP}"}


MIN_GROUP = 5  # ok prompts a label group needs to get its own vector; smaller groups are pooled


def split_by_label(validation: Mapping[str, tuple], groups: Mapping[str, Mapping[str, str]]) -> dict[str, tuple]:
    """Each set's (ids, vectors, status) split into ``<set>[<label>]`` groups; labels with fewer than
    ``MIN_GROUP`` ok prompts are pooled into ``<set>[rest]`` (dropped when that is still too small)."""
    out = {}
    for name, (ids, vecs, status) in validation.items():
        labels = groups.get(name)
        if not labels:
            out[name] = (ids, vecs, status)
            continue
        ok = Counter(labels.get(p) for p, st in zip(ids, status) if st == "ok")
        keep = {lab for lab, n in ok.items() if n >= MIN_GROUP and lab is not None}
        assign = [labels.get(p) if labels.get(p) in keep else "rest" for p in ids]
        for lab in sorted(set(assign)):
            rows = [i for i, a in enumerate(assign) if a == lab]
            if lab == "rest" and sum(status[i] == "ok" for i in rows) < MIN_GROUP and keep:
                continue
            out[f"{name}[{lab}]"] = ([ids[i] for i in rows], vecs[rows], [status[i] for i in rows])
    return out


def _floats(col) -> np.ndarray:
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
