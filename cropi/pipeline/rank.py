"""The rank job: score a pool split against validation splits and persist the ranking.

Rankings live beside the shards, one Parquet file per (checkpoint, spec, pool, selector):
``<store>/rankings/<checkpoint>/<spec_id>/<pool>.<selector>.parquet``, meta in its schema metadata (see
``ranking_name``; stores written before every ranking was named by its selector still serve theirs,
``stored_rankings``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal, Optional

import numpy as np
import pyarrow as pa
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from cropi.contracts import GRADIENT_OPTIONAL_COLUMNS, NAME_PATTERN, POOL, SELECTED, Fusion
from cropi.errors import CropiError, InvalidInputError, NotFoundError
from cropi.projection.spec import ProjectionSpec
from cropi.scoring import Ranking, rank_pool
from cropi.scoring.influence import silent_sets
from cropi.scoring.diagnostics import alignment, selection_mix
from cropi.selection import DEFAULT_SELECTOR, RANKING_SELECTORS, SELECTORS, SelectionInputs, get_selector, select
from cropi.store import GradientStore, rankings

SelectorName = Literal[SELECTORS]  # type: ignore[valid-type]  # the registry's names, spelled once there


class RankRequest(BaseModel):
    """Rank a stored pool split against stored validation splits (``cropi rank``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    store: str = Field(min_length=1, description="gradient store directory or pyarrow URI")
    name: str = Field(pattern=NAME_PATTERN, description="checkpoint name")
    pool: str = Field(POOL, pattern=NAME_PATTERN, description="pool split")
    validation: list[str] = Field(min_length=1, description="validation splits, comma separated")
    fusion: Fusion = Field("rrf", description="how validation sets' ranks are fused")
    select_fraction: float = Field(0.1, gt=0, le=1, description="fraction of the pool selected",
                                   validation_alias=AliasChoices("select_fraction", "top_fraction"))
    selector: SelectorName = Field(DEFAULT_SELECTOR, description="the rule that picks the selection from the "
                                   "ranking (cropi.selection): " + ", ".join(SELECTORS))
    selector_options: dict[str, Any] = Field(default_factory=dict, description="the selector's own options "
                                             "(each selector's closed options model checks them)")
    spec_id: Optional[str] = Field(None, description="projection spec id, when the checkpoint has several")
    max_validation: int = Field(100, gt=0, description="validation prompts averaged per set")
    seed: int = Field(0, ge=0, description="seed of the validation subsample")
    prompts: Optional[str] = Field(None, description="the pool's prompt file: adds the selection's data-source and "
                                   "answer-label mix, with warnings (cropi.scoring.diagnostics)")

    @model_validator(mode="after")
    def _selector_options(self) -> "RankRequest":
        check_selector(self.selector, self.selector_options)
        return self

    def run(self) -> "RankingResult":
        from cropi.data import load_prompts

        labels = pool_labels(load_prompts(self.prompts)) if self.prompts else None
        return rank(self.store, self.name, self.pool, self.validation, fusion=self.fusion,
                    top_fraction=self.select_fraction, spec_id=self.spec_id, max_validation=self.max_validation,
                    seed=self.seed, labels=labels, selector=self.selector, selector_options=self.selector_options)


# What a ranking stored before the selector registry selected with: its meta names no selector, and
# CROPI's top fraction was then the only rule.
UNNAMED_SELECTOR = "cropi"


def ranking_name(pool: str, selector: str) -> str:
    """The name a ranking is stored under: ``<pool>.<selector>``, for every selector, so a file means the
    same whichever selector is the default, and curricula with different selectors at one checkpoint
    never overwrite each other's ``selected`` column (their gradients, keyed by the checkpoint, are
    shared). Stores written before this named the then default selector's ranking ``<pool>``."""
    return f"{pool}.{selector}"


def stored_rankings(store: str, name: str, spec_id: str, pool: str = POOL) -> dict[str, str]:
    """Selector -> the name its ranking of ``pool`` is stored under, for every one stored at this checkpoint
    and spec. A ranking from before every ranking was named by its selector (``<pool>``) counts for the
    selector its meta records (``UNNAMED_SELECTOR`` when it records none); one stored under the new name
    since wins over it."""
    found = {s: ranking_name(pool, s) for s in SELECTORS if _ranking_exists(store, name, spec_id, ranking_name(pool, s))}
    if _ranking_exists(store, name, spec_id, pool):
        fs, path = rankings.ranking_file(store, name, spec_id, pool)
        found.setdefault(rankings.read_ranking(fs, path)[1].get("selector") or UNNAMED_SELECTOR, pool)
    return found


def stored_ranking_name(store: str, name: str, spec_id: str, pool: str = POOL, selector: str | None = None) -> str:
    """The name ``pool``'s ranking by ``selector`` at this checkpoint is stored under (a store written before
    the renaming included); refused, naming the rankings that exist, when that selector never ran here.
    With no selector (the service's one ranking of a checkpoint): the default selector's ranking when
    stored, else one from before the renaming (then the default's), else another selector's (a
    checkpoint scored once, with another selector), else the default's name (not written yet); no
    file is read to decide, so this stays cheap enough for every request."""
    wanted = selector or DEFAULT_SELECTOR
    if _ranking_exists(store, name, spec_id, ranking_name(pool, wanted)):
        return ranking_name(pool, wanted)  # the common case: one file looked at
    if selector is None:
        names = [pool, *(ranking_name(pool, s) for s in SELECTORS)]
        return next((n for n in names if _ranking_exists(store, name, spec_id, n)), ranking_name(pool, wanted))
    found = stored_rankings(store, name, spec_id, pool)
    if selector in found:
        return found[selector]
    stored = ", ".join(f"{s} ({n}.parquet)" for s, n in found.items()) or "none"
    raise NotFoundError(f"no ranking of {pool!r} by selector {selector!r} at checkpoint {name!r} (spec {spec_id}); "
                        f"rankings stored there: {stored}. Score or rank it with selector {selector!r} first")


def _ranking_exists(store: str, name: str, spec_id: str, stored_name: str) -> bool:
    from cropi.utils.fsio import file_exists

    return file_exists(*rankings.ranking_file(store, name, spec_id, stored_name))


def check_selector(name: str, options: dict) -> None:
    """Refuse, before any work, a selector the ranking cannot run or options its model refuses."""
    selector = get_selector(name)
    if name not in RANKING_SELECTORS and "pass_rates" not in selector.needs:
        raise ValueError(f"selector {name!r} does not read the ranking: a ranking's selection is made by one of "
                         f"{', '.join(RANKING_SELECTORS)} (or a pass-rate control); use a curriculum for {name!r}")
    selector.parse_options(options)


def pool_labels(records) -> dict[str, tuple[str, str]]:
    """prompt_id -> (data_source, answer): what the selection diagnostics group by."""
    return {r.prompt_id: (r.data_source, r.answer) for r in records}


@dataclass
class RankingResult:
    ranking: Ranking
    table: pa.Table
    meta: dict
    # per-prompt optional columns of the pool split (ESS, ESS/K, p_theta, std_theta:
    # {column: {prompt_id: value}}), those its gradients were stored with; not part of the
    # persisted ranking (None for a loaded one)
    ess: Optional[dict] = None

    @property
    def excluded(self) -> dict[str, int]:
        return self.ranking.excluded

    def rows(self, limit: int | None = None) -> list[dict]:
        """The ranking's rows (the first ``limit``), each with the pool's optional columns (``ess``,
        ``ess_fraction``, ``p_theta``, ``std_theta``; None where unknown) its gradients were stored with."""
        rows = (self.table if limit is None else self.table.slice(0, limit)).to_pylist()
        for col, by_id in (self.ess or {}).items():
            for r in rows:
                v = by_id.get(r["prompt_id"])
                r[col] = v if v is not None and math.isfinite(v) else None
        return rows


def selection_signal(table, chosen: list[str]) -> dict:
    """The selection's offline pass rate against the pool's, and how much its gradients agree against a
    random draw's (cropi.scoring.diagnostics.alignment): what tells a shortcut-prone subset apart."""
    picked = set(chosen)
    rows = [i for i, p in enumerate(table.prompt_ids) if p in picked]
    rates = np.asarray(table.columns["reward_mean"], dtype=np.float64)
    out = alignment(table.vectors[rows], table.vectors)
    out.pop("warnings")
    return {**out, "selection_pass_rate": float(np.nanmean(rates[rows])) if rows else None,
            "pool_pass_rate": float(np.nanmean(rates))}


def find_spec_id(store: str, name: str, spec_id: str | None, split: str) -> str:
    """The one spec a checkpoint's split was scored with, unless the caller names one."""
    found = sorted({s["spec_id"] for s in GradientStore(store).list_splits()
                    if s["checkpoint"] == name and s["split"] == split})
    if spec_id is not None:
        if spec_id not in found:
            raise NotFoundError(f"no gradients for checkpoint {name!r}, split {split!r}, spec {spec_id}; "
                                f"specs present: {found or 'none'}")
        return spec_id
    if not found:
        raise NotFoundError(f"no gradients for checkpoint {name!r}, split {split!r}: run `cropi gradients` first")
    if len(found) > 1:
        raise InvalidInputError(f"checkpoint {name!r} has several projection specs {found}: name one with --spec-id")
    return found[0]


def silent_splits(store: str, name: str, splits: list[str], spec_id: str | None = None) -> dict:
    """The splits of a scored checkpoint without one ``ok`` prompt, with their status counts
    (cropi.scoring.influence.silent_sets): a ranking leaves such a validation split out, and refuses when all
    are; such a pool has nothing to rank."""
    gs = GradientStore(store)
    return silent_sets({v: list(gs.open_split(name, find_spec_id(store, name, spec_id, v), v).read()
                                .columns["status"]) for v in splits})


def rank(store: str, name: str, pool: str, validation: list[str], *, fusion: str = "rrf",
         top_fraction: float | None = None, spec_id: str | None = None, max_validation: int = 100,
         seed: int = 0, groups: dict | None = None, labels: dict | None = None,
         replace: str | None = None, selector: str = DEFAULT_SELECTOR,
         selector_options: dict | None = None) -> RankingResult:
    """Rank and persist. ``groups`` (set -> prompt_id -> label) splits validation sets by label
    (``rank_pool``); ``labels`` (pool prompt_id -> (data_source, answer)) adds the selection's
    diagnostics to the ranking's meta under ``selection``. ``replace`` names a split of the same
    checkpoint whose rows stand in for the pool's rows of its prompts (a refresh's recomputed
    gradients, ``cropi.pipeline.score``); that ranking is stored under ``replace``'s name, so the
    pool's own ranking stays as it was. ``selector`` (cropi.selection) picks the ``selected``
    column; the checkpoint's name salts its random draws, so every stage draws afresh. The ranking is
    stored under ``ranking_name`` (named by its selector)."""
    if not validation:
        raise InvalidInputError("name at least one validation split")
    spec_id = find_spec_id(store, name, spec_id, pool)
    gs = GradientStore(store)
    pool_split = gs.open_split(name, spec_id, pool)
    pool_t = pool_split.read()
    if replace is not None:
        pool_t = pool_t.replace_rows(gs.open_split(name, spec_id, replace).read())
    val = {}
    for v in validation:
        t = gs.open_split(name, spec_id, v).read()
        pool_t.ensure_comparable(t)
        val[v] = (t.prompt_ids, t.vectors, list(t.columns["status"]))
    ranking = rank_pool(pool_t.prompt_ids, pool_t.vectors, list(pool_t.columns["status"]), val,
                        fusion=fusion, max_validation=max_validation, seed=seed, groups=groups)
    picked = None
    if top_fraction:
        rates = dict(zip(pool_t.prompt_ids, pool_t.columns["reward_mean"].tolist()))
        inputs = SelectionInputs(prompt_ids=pool_t.prompt_ids, fraction=top_fraction, seed=seed, salt=name,
                                 pass_rates=rates, ranking=ranking, vectors=pool_t.vectors)
        picked = select(selector, inputs, selector_options)
    chosen = picked.chosen if picked else []
    selected = set(chosen)
    table = ranking.to_table()
    table = table.append_column(SELECTED, pa.array([p in selected for p in table["prompt_id"].to_pylist()]))

    meta = ranking.meta | {"checkpoint": name, "spec_id": spec_id, **projection_record(pool_split.spec, pool_split.extra),
                           "pool": pool, "validation": validation,
                           "top_fraction": top_fraction, "excluded": ranking.excluded,
                           "checkpoint_fingerprint": pool_t.checkpoint.fingerprint, "created": time.time(),
                           **(picked.record() if picked else {})}
    if replace is not None:
        meta["replaced_by"] = replace
    if groups:
        meta["validation_groups"] = sorted(ranking.scores)
    if labels is not None and top_fraction:
        meta["selection"] = selection_mix(chosen, labels) | selection_signal(pool_t, chosen)
        # what the ranking itself warns of (a silent validation set) travels with the selection's own warnings
        meta["selection"]["warnings"] = [*ranking.meta.get("warnings", []), *meta["selection"]["warnings"]]
    _save(store, name, spec_id, ranking_name(replace or pool, selector), table, meta)
    ess = {c: dict(zip(pool_t.prompt_ids, pool_t.columns[c].tolist()))
           for c in GRADIENT_OPTIONAL_COLUMNS if c in pool_t.columns} or None
    return RankingResult(ranking, table, meta, ess)


def projection_record(spec: dict, extra: dict | None = None) -> dict:
    """What a ranking records of its vectors' projection: the spec, and where its fidelity was measured
    with the model in the dtype the vectors were computed in (the split's ``extra["model"]``, absent for
    float32; the entry names the device and dtype of that measurement; None: never measured so, and
    ``cropi rank`` prints the notice)."""
    from cropi.projection.fidelity import measured

    model = (extra or {}).get("model") if isinstance(extra, dict) else None
    dtype = model.get("model_dtype", "float32") if isinstance(model, dict) else "float32"
    try:
        fidelity = measured(ProjectionSpec.from_record(spec), dtype)
    except (CropiError, ValueError, TypeError):  # an older or foreign record: the spec is still kept
        fidelity = None
    return {"projection": {k: v for k, v in spec.items() if k != "spec_id"}, "fidelity": fidelity}


def _save(store, name, spec_id, pool, table: pa.Table, meta: dict) -> None:
    rankings.save(store, name, spec_id, pool, table, meta)


def load_ranking(store: str, name: str, *, pool: str | None = None, spec_id: str | None = None,
                 selector: str | None = None) -> RankingResult:
    """The stored ranking of a checkpoint, checksum verified. With ``selector``: ``pool``'s ranking (default:
    the pool's) by that selector, under whichever name it was stored (``stored_ranking_name``; the spec
    is the checkpoint's only one unless named). Without: the file named ``pool`` (a ranking's stored
    name, as ``ScoreResult.ranking`` gives it), the checkpoint's only pool and spec unless named."""
    if selector is not None:
        pool = pool or POOL
        spec_id = find_spec_id(store, name, spec_id, pool)
        pool = stored_ranking_name(store, name, spec_id, pool, selector)
    table, meta = rankings.load(store, name, pool=pool, spec_id=spec_id)
    return RankingResult(Ranking.from_table(table.drop_columns([SELECTED]), meta), table, meta)
