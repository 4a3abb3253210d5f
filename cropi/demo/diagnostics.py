"""Why a selection helps or hurts: saturation and interference diagnostics of every method's stages.

Read from what the runs stored, per method, seed and stage (``report.json``'s ``diagnostics``):

- ``passes_per_stage``: prompts the trainer drew in the stage over the subset's size (a 10%
  subset trained 40 steps of 16 prompts is seen 5.3 times; the whole pool 0.5 times);
- ``zero_advantage_share``: the stage's mean share of groups whose rewards were all equal (their
  gradient is zero: a subset the model has saturated trains on fewer prompts than it holds);
- ``selection_pass_rate`` / ``pool_pass_rate``: theta_0's offline pass rate over the subset and
  over the pool;
- ``selection_alignment`` / ``random_alignment`` / ``batch_signal_to_noise``: the subset's mean
  pairwise cosine of theta_0's projected gradients against a random draw's
  (cropi.scoring.diagnostics.alignment), the same reference gradients for every method;
- ``fields``: the skew of each field the task declares (``Task.fields``; lists: the answer's
  position in the list), with the warnings;
- ``validation_change``: the validation sets' sampled accuracy at the stage's end minus at its
  start (the trainer reads them at step 0 and at every stage's end; the test splits never);
- ``ranking_change``: from the stage record, Spearman's rho between the stage's influence ranking and the last
  stage's (cropi.scoring.diagnostics.ranking_change), with its ``ranking_turned_over`` warnings.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from cropi.contracts import POOL
from cropi.data import load_prompts
from cropi.scoring.diagnostics import TURNED_OVER, alignment, field_skew
from cropi.tasks.base import Task

NUMBERS = ("passes_per_stage", "zero_advantage_share", "selection_pass_rate", "pool_pass_rate",
           "selection_alignment", "random_alignment", "batch_signal_to_noise", "validation_change", "ranking_change")


def stage_diagnostics(runs: list[dict], task: Task, pool_path: str, batch: int, k: int) -> dict:
    """method -> {"by_seed": seed -> stage -> row, "mean": stage -> mean row over seeds, "warnings": [...]}."""
    ref = _theta0_gradients(runs)
    pool = load_prompts(pool_path)
    fields = {name: {r.prompt_id: fn(r) for r in pool} for name, fn in task.fields.items()}
    out: dict = {}
    for method in sorted({r["method"] for r in runs}):
        by_seed, warnings = {}, []
        for run in (r for r in runs if r["method"] == method):
            rows = {}
            for stage in run["stages"]:
                row, warned = _stage_row(run, stage, ref, fields, batch, k)
                rows[str(stage["index"])] = row
                warnings += [{"seed": run["seed"], "stage": stage["index"], **w} for w in warned]
            by_seed[str(run["seed"])] = rows
        out[method] = {"by_seed": by_seed, "mean": _mean_rows(by_seed), "warnings": warnings}
    return out


def _stage_row(run: dict, stage: dict, ref: dict | None, fields: dict, batch: int, k: int) -> tuple[dict, list]:
    chosen = [r.prompt_id for r in load_prompts(stage["subset"])]
    m = stage["index"]
    steps = [s for s in run["steps"] if s.get("stage") == m]
    row = {"n_selected": len(chosen), "passes_per_stage": len(steps) * batch / max(len(chosen), 1),
           "zero_advantage_share": _mean([s["zero_advantage_groups"] for s in steps]),
           "validation_change": _validation_change(run, stage, k)}
    recorded = stage.get("selection") or {}
    row["ranking_change"] = (recorded.get("ranking_change") or {}).get("spearman")
    warned: list = [w for w in recorded.get("warnings", []) if w.get("code") == TURNED_OVER]
    if ref is not None:
        rows = [ref["index"][p] for p in chosen if p in ref["index"]]
        row["selection_pass_rate"] = _mean(ref["pass_rate"][rows])
        row["pool_pass_rate"] = _mean(ref["pass_rate"])
        align = alignment(ref["vectors"][rows], ref["vectors"], batch)
        warned += align.pop("warnings")
        row |= align
    skew = field_skew(chosen, fields)
    row["fields"] = skew["fields"]
    return row, warned + skew["warnings"]


def _validation_change(run: dict, stage: dict, k: int) -> float | None:
    """Sampled validation accuracy (mean over the sets) at the stage's end minus at its start."""
    reads = {row["step"]: float(np.mean([e[f"mean@{k}"] for e in row["stage_eval"].values()]))
             for row in run["evals"] if row.get("stage_eval")}
    end = stage.get("global_step")
    if end is None:
        return None
    start = end - stage["steps_done"]
    return reads[end] - reads[start] if start in reads and end in reads else None


def _theta0_gradients(runs: list[dict]) -> dict | None:
    """The pool's projected gradients and offline pass rates at theta_0: CROPI's first stage's split
    (the demo's shared score phase), the one reference every method's subsets are measured against."""
    from cropi.store import GradientStore

    for run in sorted((r for r in runs if r.get("selection") == "cropi"), key=lambda r: r["seed"]):
        ranking = run["stages"][0].get("ranking") if run["stages"] else None
        if not ranking:
            continue
        path = Path(ranking)  # <root>/store/rankings/<checkpoint>/<spec_id>/<pool>.parquet
        table = GradientStore(str(path.parents[3])).open_split(path.parts[-3], path.parts[-2], POOL).read()
        ok = np.asarray(table.columns["status"]) == "ok"
        vectors = np.where(ok[:, None], np.asarray(table.vectors, dtype=np.float64), 0.0)
        return {"index": {p: i for i, p in enumerate(table.prompt_ids)}, "vectors": vectors,
                "pass_rate": np.asarray(table.columns["reward_mean"], dtype=np.float64)}
    return None


def _mean_rows(by_seed: dict) -> dict:
    stages: dict = defaultdict(list)
    for rows in by_seed.values():
        for m, row in rows.items():
            stages[m].append(row)
    return {m: {key: _mean([r.get(key) for r in rows]) for key in NUMBERS}
            for m, rows in sorted(stages.items(), key=lambda kv: int(kv[0]))}


def _mean(values) -> float | None:
    v = [float(x) for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else None
