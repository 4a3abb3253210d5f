"""Refresh: re-collect, at the current checkpoint, the trajectories of the prompts whose reused
ones no longer represent the policy, within a budget. Two criteria, from the per-prompt
diagnostics stored with the gradients the checkpoint was scored with:

- ``ess``: ESS/K below a threshold, lowest first (the weights have degenerated).
- ``status``: the probability that a group of K sampled afresh at the checkpoint would differ
  from the reused group in whether it carries signal (mixed rewards) is above a threshold,
  highest first. The reused group decides whether a prompt is ranked at all (all-equal
  rewards give a zero gradient), and that is what drifts as the policy trains: prompts the
  policy now always solves keep a full gradient from the behavior's mixed rewards, and
  prompts the behavior never solved stay unranked after the policy learns them. With
  m_K(p) = 1 - p^K - (1-p)^K the probability that K Bernoulli(p) rewards are mixed:

      reused group mixed:      1 - m_K(p_theta)     (p_theta: self-normalised weighted pass rate)
      reused group all failed: m_K(1 - mean w)      (1 - mean w: the probability mass theta took
      reused group all passed: m_K(mean w)           off the observed failures / kept on the passes)

  The self-normalised p_theta cannot leave 0 or 1 for an all-equal group whatever the weights,
  hence the ordinary importance-sampling mass (1/K) sum_k w_k there (stored as its log).

Scoring runs no forward pass on a group whose rewards are all equal (its gradient is zero at every
theta), so its ESS, ESS/K and log mean weight are not stored (null). Given the trajectory store the
gradients were computed from (``trajectories``; the score step passes it), the refresh computes
what its criterion needs for those prompts at the checkpoint (``weight_diagnostics``: a no-grad
forward over them only, in the dtype and attention the gradients ran in), so both criteria see them
as before. Without it their value is unknown and neither criterion chooses them (under ``status``
they are the groups the policy may have learned or unlearned: pass the store); the plan and the
printed summary count them (``all_equal_unknown``).

``groups: all_equal`` re-collects only prompts whose reused group's rewards were all equal: the blind
spot, whose gradient is zero at every checkpoint. A mixed group's gradient already follows the
checkpoint through its importance ratios; refreshing it mostly drops the prompt from the ranking (its
fresh group is then likely all-equal), which is a saturation filter rather than a repair.

The choice is frozen in ``<out>/plan.json`` the first time, so a killed refresh resumes the same
prompts (the collection itself skips what it already committed). Layout of ``out``::

    plan.json        checkpoint, criterion, threshold, budget, the chosen prompts and their values,
                     and how many all-equal prompts were left unknown (``all_equal_unknown``)
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
from pydantic import Field

from cropi.contracts import NAME_PATTERN, POOL, Backend
from cropi.data import load_prompts, write_jsonl
from cropi.errors import InvalidInputError, MismatchError
from cropi.generation import EngineOptions, SamplingConfig
from cropi.gradients.popi import mixed_probability
from cropi.pipeline.collect import CollectJob, collect, collected
from cropi.pipeline.progress import Progress
from cropi.pipeline.rank import find_spec_id
from cropi.pipeline.requests import RefreshOptions
from cropi.store import GradientStore
from cropi.utils.fsio import read_json, resolve, write_json_atomic


_COLLECT = CollectJob.model_fields  # the re-collection's options: the collect job's own fields and defaults
# What a plan written before a field existed meant by its absence (plans keep omitting them at these values)
PLAN_DEFAULTS = {"criterion": "ess", "groups": "any"}


class RefreshJob(RefreshOptions):
    """Which split's gradients decide, where the checkpoint is, and how to re-collect (``cropi refresh``)."""

    model: str = Field(min_length=1, description="the current checkpoint: trajectories are sampled from it")
    prompts: str = Field(min_length=1, description="the split's prompt file (records of the prompts to refresh "
                         "come from it)")
    gradients: str = Field(min_length=1, description="gradient store directory or pyarrow URI")
    checkpoint: str = Field(pattern=NAME_PATTERN, description="checkpoint name in the gradient store (the one "
                            "whose gradients give each prompt's diagnostics)")
    spec_id: Optional[str] = Field(None, description="projection spec id, when the checkpoint has several")
    split: str = Field(POOL, pattern=NAME_PATTERN, description="the split to refresh")
    out: str = Field(min_length=1, description="output folder: plan.json, prompts.jsonl, trajectories/")
    trajectories: Optional[str] = Field(
        None, description="the trajectory store the split's gradients were computed from. Scoring runs no "
        "forward pass on a prompt whose rewards were all equal, so its ESS/K and log mean weight are not stored; "
        "with this store they are computed at --model (which must be the checkpoint of the gradients) for the "
        "criterion. Without it such prompts have no value and are never chosen, by either criterion "
        "(all_equal_unknown counts them)")
    sampling: SamplingConfig = _COLLECT["sampling"]
    backend: Backend = _COLLECT["backend"]
    reward: str = _COLLECT["reward"]
    batch_prompts: Optional[int] = _COLLECT["batch_prompts"]
    engine: EngineOptions = _COLLECT["engine"]


def status_change_probability(reward_mean, reward_std, n_responses, p_theta, log_mean_weight) -> np.ndarray:
    """Per prompt, the probability that a group of its K responses sampled at theta would differ
    from the reused group in carrying signal (see the module doc); NaN where a value is unknown.
    Rewards are taken as 0/1: an all-equal group failed when its mean is below 1/2."""
    mean, std = np.asarray(reward_mean, np.float64), np.asarray(reward_std, np.float64)
    k, p = np.asarray(n_responses, np.float64), np.asarray(p_theta, np.float64)
    log_mass = np.asarray(log_mean_weight, np.float64)
    mass = np.exp(np.minimum(log_mass, 1.0))  # any mass above 1 clips alike: no overflow
    unseen = np.where(mean < 0.5, 1.0 - mass, mass)  # theta's pass rate on what the group never saw
    mixed = std > 0
    out = np.where(mixed, 1.0 - _mixed(p, k), _mixed(unseen, k))
    return np.where(np.isfinite(p) & np.isfinite(log_mass) & (k >= 2), out, np.nan)


def _mixed(p: np.ndarray, k: np.ndarray) -> np.ndarray:
    return np.array([mixed_probability(a, int(b)) if np.isfinite(a) and b >= 1 else np.nan
                     for a, b in zip(p.tolist(), k.tolist())], dtype=np.float64)


def select_above(prompt_ids: list[str], values, above: float, budget: float) -> list[str]:
    """The prompts whose value is above ``above``, highest first (ties by id), at most
    floor(budget * n). Unknown values (NaN) are never selected."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (len(prompt_ids),):
        raise InvalidInputError(f"{len(prompt_ids)} prompt ids but {values.shape} values")
    cap = math.floor(budget * len(prompt_ids) + 1e-9)
    high = [(-v, p) for p, v in zip(prompt_ids, values.tolist()) if v > above]  # NaN > x is False
    return [p for _, p in sorted(high)[:cap]]


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
        again = CollectJob(model=job.model, prompts=prompt_file, out=str(Path(job.out) / "trajectories"),
                           sampling=job.sampling, backend=job.backend, reward=job.reward,
                           batch_prompts=job.batch_prompts, engine=job.engine)
        # a refresh run again (a checkpoint scored again): no engine started. What it holds is this refresh's: the
        # folder is named by the checkpoint (whose name hashes its trajectories), the model and the options
        if collected(again):
            counts = {"collected": 0, "skipped": len(records), "total": len(records)}
        else:
            counts = collect(again, progress, backend=backend)
    else:
        counts = {"collected": 0, "skipped": 0, "total": 0}
    return {"plan": plan, **counts}


def summary(result: dict) -> dict:
    """What ``cropi refresh`` prints: the plan's settings, how many prompts it chose (and which),
    and the collect counts (without the plan's per-prompt values, which are in plan.json).
    ``all_equal_unknown``: the prompts with all-equal rewards the criterion could not value (their
    weights were not computed: no ``trajectories``), never chosen; None in a plan written before it."""
    plan = result["plan"]
    keys = ("checkpoint", "spec_id", "split", "criterion", "below", "above", "budget", "groups", "pool_size",
            "all_equal_unknown")
    head = {k: plan.get(k, PLAN_DEFAULTS.get(k)) for k in keys}
    head.pop("above" if head["criterion"] == "ess" else "below")  # the other criterion's threshold
    counts = {k: v for k, v in result.items() if k != "plan"}
    return head | {"chosen": len(plan["selected"]), "selected": plan["selected"]} | counts


def _plan(job: RefreshJob, fs, path: str) -> dict:
    want = {"checkpoint": job.checkpoint, "spec_id": job.spec_id, "split": job.split, "model": job.model,
            "below": job.below, "budget": job.budget}
    if job.criterion != "ess":  # plans of ESS refreshes stay as they were written before the choice
        want |= {"criterion": job.criterion, "above": job.above}
    if job.groups != "any":  # likewise plans written before this choice
        want |= {"groups": job.groups}
    try:
        stored = read_json(fs, path)
    except Exception:  # no plan yet (a damaged one is rewritten: nothing was collected without a plan)
        stored = None
    if isinstance(stored, dict) and "selected" in stored:
        differ = [k for k, v in (want | {"groups": job.groups}).items() if stored.get(k, PLAN_DEFAULTS.get(k)) != v]
        if differ:
            raise MismatchError(f"{path} plans a refresh with other settings ({', '.join(differ)}); "
                                "use another output folder or delete it")
        return stored
    split = GradientStore(job.gradients).open_split(job.checkpoint, job.spec_id, job.split)
    table = split.read(verify=True)
    values, unweighed = _criterion_values(job, table, split)
    if job.criterion == "ess":
        selected = select_for_refresh(table.prompt_ids, values, job.below, job.budget)
    else:
        selected = select_above(table.prompt_ids, values, job.above, job.budget)
    row = {p: i for i, p in enumerate(table.prompt_ids)}
    column = "ess_fraction" if job.criterion == "ess" else "status_change_probability"
    plan = want | {"pool_size": len(table), "all_equal_unknown": unweighed, "selected": selected,
                   column: {p: float(values[row[p]]) for p in selected}}
    write_json_atomic(fs, path, plan)
    return plan


def _criterion_values(job: RefreshJob, table, split) -> tuple[np.ndarray, int]:
    """The per-prompt value the criterion thresholds (NaN, never chosen, for a mixed group under
    ``groups: all_equal``) and how many prompts whose rewards were all equal it leaves unknown."""
    values, unknown = _all_values(job, table, split)
    if job.groups == "all_equal":
        values = np.where(np.asarray(table.columns["reward_std"], np.float64) > 0, np.nan, values)
    return values, unknown


def _all_values(job: RefreshJob, table, split) -> tuple[np.ndarray, int]:
    """The per-prompt value the criterion thresholds (a clear error when the split lacks its columns)
    and how many prompts whose rewards were all equal it leaves unknown. Their weights, which scoring
    does not compute, are computed here when ``job.trajectories`` is given (see the module doc)."""
    c = table.columns
    if job.criterion == "ess":
        if table.ess_fraction is None:
            raise InvalidInputError(f"the gradients of split {job.split!r} at {job.checkpoint!r} were stored "
                                    "without ESS; recompute them with this cropi to refresh by ESS")
        values = _weighed(job, table, split, table.ess_fraction, "ess_fraction")
        return values, len(_unweighed(table, values))
    if table.p_theta is None or table.log_mean_weight is None:
        raise InvalidInputError(f"the gradients of split {job.split!r} at {job.checkpoint!r} were stored without "
                                "p_theta and log_mean_weight; recompute them with this cropi to refresh by status")
    log_mass = _weighed(job, table, split, table.log_mean_weight, "log_mean_weight")
    values = status_change_probability(c["reward_mean"], c["reward_std"], c["n_responses"], table.p_theta, log_mass)
    return values, len(_unweighed(table, log_mass))


def _weighed(job: RefreshJob, table, split, stored: np.ndarray, column: str) -> np.ndarray:
    """``stored`` (a column of the split) with the values of the groups scoring did not run filled in
    from their weights at the checkpoint, when ``job.trajectories`` is given (NaN otherwise)."""
    values = np.array(stored, dtype=np.float64)
    rows = _unweighed(table, values)
    if rows and job.trajectories is not None:
        weighed = _weigh(job, split, [table.prompt_ids[i] for i in rows])
        for i in rows:
            value = weighed[table.prompt_ids[i]][column]
            values[i] = float("nan") if value is None else value
    return values


def _unweighed(table, values: np.ndarray) -> list[int]:
    """Rows whose group scoring did not run (status zero_advantage: rewards all equal) with an unknown
    ``values`` (their weights were never computed), of two responses or more (one gives no value)."""
    c = table.columns
    return [i for i, (s, k, v) in enumerate(zip(c["status"], c["n_responses"], values))
            if s == "zero_advantage" and k >= 2 and not math.isfinite(v)]


def _weigh(job: RefreshJob, split, prompt_ids: list[str]) -> dict[str, dict]:
    """``weight_diagnostics`` of ``prompt_ids`` at ``job.model`` over ``job.trajectories``, both checked
    to be what the split's gradients were computed from (else the weights would not be theirs)."""
    import torch

    from cropi.gradients import LossOptions
    from cropi.gradients.batched import weight_diagnostics
    from cropi.gradients.options import recorded_run
    from cropi.models.loading import load_causal_lm
    from cropi.pipeline.compute_gradients import _identity_hash
    from cropi.store import TrajectoryStore
    from cropi.utils.device import resolve_device
    from cropi.utils.fingerprint import model_fingerprint

    trajectories = TrajectoryStore.open(job.trajectories)
    if split.extra.get("trajectories") != _identity_hash(trajectories.identity):
        raise MismatchError(f"{job.trajectories} is not the trajectory store the gradients of split {job.split!r} "
                            f"at {job.checkpoint!r} were computed from: pass that one")
    if model_fingerprint(job.model) != split.checkpoint.fingerprint:
        raise MismatchError(f"{job.model} is not the checkpoint the gradients {job.checkpoint!r} were computed at: "
                            "the weights of their all-equal groups are computed at that checkpoint")
    # in the dtype and attention the gradients ran in (their identity records them): on CUDA bfloat16 with sdpa, so
    # the all-equal groups' weights are computed as the other groups' were, and not in float32 (several times slower)
    dtype, attention = recorded_run(split.extra.get("model"))
    model = load_causal_lm(job.model, device=resolve_device("auto"), dtype=dtype, attn_implementation=attention)
    try:
        loss = LossOptions(**split.extra.get("loss", {}))  # the gradients' own: their context limit and batching
        return weight_diagnostics(model, trajectories.iter_prompts(prompt_ids), loss)
    finally:
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # before the collection's engine starts
