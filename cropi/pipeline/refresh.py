"""Refresh: re-collect, at the current checkpoint, the trajectories of the prompts whose reused
ones no longer represent the policy (low effective sample size), within a budget.

The ESS/K of every prompt comes from the gradients the checkpoint was scored with
(the store's ``ess_fraction`` column). The prompts below the threshold are taken
lowest first, at most ``budget`` of the split; the choice is frozen in
``<out>/plan.json`` the first time, so a killed refresh resumes the same prompts
(the collection itself skips what it already committed). Layout of ``out``::

    plan.json        checkpoint, threshold, budget, the chosen prompts and their ESS/K
    prompts.jsonl    the chosen prompt records
    trajectories/    a trajectory store sampled at the checkpoint (the collect job's)

Recomputing the gradients of the refreshed prompts is the gradients job over
``trajectories/``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cropi.contracts import NAME_PATTERN, POOL, Backend
from cropi.data import load_prompts, write_jsonl
from cropi.errors import InvalidInputError, MismatchError
from cropi.generation import EngineOptions, SamplingConfig
from cropi.pipeline.collect import CollectJob, collect
from cropi.pipeline.progress import Progress
from cropi.pipeline.rank import find_spec_id
from cropi.store import GradientStore
from cropi.utils.fsio import read_json, resolve, write_json_atomic


_COLLECT = CollectJob.model_fields  # the re-collection's options: the collect job's own fields and defaults


class RefreshJob(BaseModel):
    """Which split's gradients decide, where the checkpoint is, and how to re-collect (``cropi refresh``)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="the current checkpoint: trajectories are sampled from it")
    prompts: str = Field(min_length=1, description="the split's prompt file (records of the prompts to refresh "
                         "come from it)")
    gradients: str = Field(min_length=1, description="gradient store directory or pyarrow URI")
    checkpoint: str = Field(pattern=NAME_PATTERN, description="checkpoint name in the gradient store (the one "
                            "whose gradients give each prompt's ESS/K)")
    spec_id: Optional[str] = Field(None, description="projection spec id, when the checkpoint has several")
    split: str = Field(POOL, pattern=NAME_PATTERN, description="the split to refresh")
    out: str = Field(min_length=1, description="output folder: plan.json, prompts.jsonl, trajectories/")
    below: float = Field(gt=0, le=1, description="refresh prompts whose ESS/K is below this")
    budget: float = Field(gt=0, le=1, description="at most this fraction of the split's prompts")
    sampling: SamplingConfig = _COLLECT["sampling"]
    backend: Backend = _COLLECT["backend"]
    reward: str = _COLLECT["reward"]
    batch_prompts: Optional[int] = _COLLECT["batch_prompts"]
    engine: EngineOptions = _COLLECT["engine"]


def select_for_refresh(prompt_ids: list[str], ess_fraction, below: float, budget: float) -> list[str]:
    """The prompts with ESS/K < ``below``, lowest first (ties by id), at most floor(budget * n).
    Unknown ESS (NaN) is never selected."""
    values = np.asarray(ess_fraction, dtype=np.float64)
    if values.shape != (len(prompt_ids),):
        raise InvalidInputError(f"{len(prompt_ids)} prompt ids but {values.shape} ESS values")
    cap = math.floor(budget * len(prompt_ids) + 1e-9)
    low = [(v, p) for p, v in zip(prompt_ids, values.tolist()) if v < below]  # NaN < x is False
    return [p for _, p in sorted(low)[:cap]]


def refresh(job: RefreshJob, progress: Progress | None = None, backend=None) -> dict:
    """Plan (once) and run (or resume) the re-collection; returns the plan and the collect counts."""
    if job.spec_id is None:
        job = job.model_copy(update={"spec_id": find_spec_id(job.gradients, job.checkpoint, None, job.split)})
    fs, base = resolve(job.out)
    fs.create_dir(base, recursive=True)
    plan = _plan(job, fs, f"{base}/plan.json")
    prompt_file = str(Path(job.out) / "prompts.jsonl")
    if plan["selected"]:
        wanted = set(plan["selected"])
        records = [r for r in load_prompts(job.prompts) if r.prompt_id in wanted]
        missing = wanted - {r.prompt_id for r in records}
        if missing:
            raise InvalidInputError(f"{len(missing)} prompts chosen for refresh are not in {job.prompts}: "
                                    f"{sorted(missing)[:5]}; pass the split's prompt file")
        write_jsonl(records, prompt_file)
        counts = collect(CollectJob(model=job.model, prompts=prompt_file, out=str(Path(job.out) / "trajectories"),
                                    sampling=job.sampling, backend=job.backend, reward=job.reward,
                                    batch_prompts=job.batch_prompts, engine=job.engine), progress, backend=backend)
    else:
        counts = {"collected": 0, "skipped": 0, "total": 0}
    return {"plan": plan, **counts}


def summary(result: dict) -> dict:
    """What ``cropi refresh`` prints: the plan's settings, how many prompts it chose (and which),
    and the collect counts (without the plan's per-prompt ESS/K, which is in plan.json)."""
    plan = result["plan"]
    head = {k: plan[k] for k in ("checkpoint", "spec_id", "split", "below", "budget", "pool_size")}
    counts = {k: v for k, v in result.items() if k != "plan"}
    return head | {"chosen": len(plan["selected"]), "selected": plan["selected"]} | counts


def _plan(job: RefreshJob, fs, path: str) -> dict:
    want = {"checkpoint": job.checkpoint, "spec_id": job.spec_id, "split": job.split, "model": job.model,
            "below": job.below, "budget": job.budget}
    try:
        stored = read_json(fs, path)
    except Exception:  # no plan yet (a damaged one is rewritten: nothing was collected without a plan)
        stored = None
    if isinstance(stored, dict) and "selected" in stored:
        differ = [k for k, v in want.items() if stored.get(k) != v]
        if differ:
            raise MismatchError(f"{path} plans a refresh with other settings ({', '.join(differ)}); "
                                "use another output folder or delete it")
        return stored
    table = GradientStore(job.gradients).open_split(job.checkpoint, job.spec_id, job.split).read(verify=True)
    if table.ess_fraction is None:
        raise InvalidInputError(f"the gradients of split {job.split!r} at {job.checkpoint!r} were stored without "
                                "ESS; recompute them with this cropi to refresh by ESS")
    selected = select_for_refresh(table.prompt_ids, table.ess_fraction, job.below, job.budget)
    row = {p: i for i, p in enumerate(table.prompt_ids)}
    plan = want | {"pool_size": len(table), "selected": selected,
                   "ess_fraction": {p: float(table.ess_fraction[row[p]]) for p in selected}}
    write_json_atomic(fs, path, plan)
    return plan
