"""Refresh by status: the status-change probability against hand values, and the refresh picks
exactly the prompts its criterion names, within the budget."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from cropi.data import write_jsonl
from cropi.demo.assets import shipped_model, task_splits
from cropi.errors import InvalidInputError, MismatchError
from cropi.generation import SamplingConfig
from cropi.pipeline.refresh import RefreshJob, refresh, select_above, status_change_probability, summary
from cropi.store import CheckpointRef, GradientStore, TrajectoryStore

SPEC = {"kind": "sjlt", "dim": 4, "seed": 0, "spec_id": "s4"}


def test_status_change_probability_hand_values():
    # (reward mean, reward std, K, p_theta, mean weight) -> hand value
    cases = [
        ((0.5, 0.53, 8, 0.95, 1.0), 0.95 ** 8 + 0.05 ** 8),      # mixed: a fresh group all-equal
        ((0.5, 0.53, 8, 0.5, 1.0), 0.5 ** 8 + 0.5 ** 8),
        ((0.0, 0.0, 8, 0.0, 0.7), 1 - 0.3 ** 8 - 0.7 ** 8),      # all failed, theta took 0.3 off the failures
        ((1.0, 0.0, 8, 1.0, 0.9), 1 - 0.9 ** 8 - 0.1 ** 8),      # all passed, theta kept 0.9 on the passes
        ((0.0, 0.0, 4, 0.0, 1.3), 0.0),                          # more mass on the failures: still all fail
        ((1.0, 0.0, 4, 1.0, 2.0), 0.0),
    ]
    cols = list(zip(*[c for c, _ in cases]))
    got = status_change_probability(cols[0], cols[1], cols[2], cols[3], np.log(cols[4]))
    assert got.tolist() == pytest.approx([v for _, v in cases], rel=1e-12, abs=1e-15)
    # a mean weight of e^800 (overflow-sized): as any mass above 1, the group stays as it was
    got = status_change_probability([0.0, 1.0], [0.0, 0.0], [8, 8], [0.0, 1.0], [800.0, 800.0])
    assert got.tolist() == [0.0, 0.0]
    # unknown p_theta or weight, or a single response: never a value
    got = status_change_probability([0.5, 0.5, 1.0], [0.7, 0.7, 0.0], [8, 8, 1], [np.nan, 0.5, 1.0],
                                    [0.0, np.nan, 0.0])
    assert np.isnan(got).all()


def test_select_above_highest_first_within_budget():
    ids = [f"p{i}" for i in range(10)]
    values = [0.9, 0.1, 0.55, np.nan, 0.7, 0.5, 0.95, 0.7, 0.2, 0.51]
    # above 0.5: p6 .95, p0 .9, p4 .7, p7 .7 (tie: by id), p2 .55, p9 .51 (p5 = 0.5 is not above; NaN never)
    assert select_above(ids, values, 0.5, 1.0) == ["p6", "p0", "p4", "p7", "p2", "p9"]
    assert select_above(ids, values, 0.5, 0.3) == ["p6", "p0", "p4"]  # floor(0.3 * 10) = 3
    assert select_above(ids, values, 0.5, 0.09) == []
    assert select_above(ids, values, 0.95, 1.0) == []                 # strictly above
    with pytest.raises(InvalidInputError, match="values"):
        select_above(ids, values[:3], 0.5, 1.0)


# (reward_mean, reward_std, p_theta, mean weight) per prompt, K = 8
ROWS = [(0.5, 0.53, 0.97, 1.0),   # 0: mixed, theta solves it: 0.97^8 = 0.78
        (0.5, 0.53, 0.5, 1.0),    # 1: mixed and still mixed: 0.008
        (0.0, 0.0, 0.0, 0.5),     # 2: all failed, half the mass moved: 1 - 2 (0.5^8) = 0.992
        (0.0, 0.0, 0.0, 0.98),    # 3: all failed, barely moved: 1 - 0.02^8 - 0.98^8 = 0.149
        (0.25, 0.46, 0.02, 1.0),  # 4: mixed, theta never solves it: 0.98^8 = 0.851
        (1.0, 0.0, 1.0, 1.0),     # 5: all passed, unchanged: 0
        (0.5, 0.53, None, None),  # 6: unknown
        (0.5, 0.53, 0.9, 1.0),    # 7: 0.9^8 + 0.1^8 = 0.43: below 1/2
        (0.0, 0.0, 0.0, 0.8),     # 8: 1 - 0.2^8 - 0.8^8 = 0.832
        (0.5, 0.53, 0.5, 1.0)]


def brute_force_value(mean, std, p, w, k=8):
    if p is None:
        return float("nan")
    if std > 0:
        return p ** k + (1 - p) ** k
    q = min(max(1 - w if mean == 0 else w, 0.0), 1.0)
    return 1 - q ** k - (1 - q) ** k


def make_inputs(tmp_path, rows, with_theta=True):
    records = task_splits()["pool"][:len(rows)]
    write_jsonl(records, str(tmp_path / "pool.jsonl"))
    split = GradientStore(str(tmp_path / "grads")).split(CheckpointRef(name="ck", fingerprint="f"), SPEC, "pool",
                                                          dim=4, dtype="float32")
    with split.writer("w0") as w:
        for r, (mean, std, p, mw) in zip(records, rows):
            extra = dict(p_theta=p, log_mean_weight=None if mw is None else math.log(mw)) if with_theta else {}
            w.append(r.prompt_id, np.ones(4), 1.0, 8, mean, std, 20, "ok", ess=8.0, ess_fraction=1.0, **extra)
    return records


def job(tmp_path, **kw):
    return RefreshJob(model=str(shipped_model()), prompts=str(tmp_path / "pool.jsonl"), gradients=str(tmp_path / "grads"),
                      checkpoint="ck", spec_id="s4", split="pool", out=str(tmp_path / "refresh"),
                      criterion=kw.pop("criterion", "status"),
                      budget=kw.pop("budget", 0.3), backend="hf", reward="exact_numeric",
                      sampling=SamplingConfig(samples=2, max_new_tokens=4), batch_prompts=1, **kw)


def test_refresh_by_status_collects_exactly_the_prompts_its_criterion_names(tmp_path):
    records = make_inputs(tmp_path, ROWS)
    values = {r.prompt_id: brute_force_value(*row) for r, row in zip(records, ROWS)}
    above = sorted((p for p, v in values.items() if v > 0.5), key=lambda p: (-values[p], p))
    assert [records.index(next(r for r in records if r.prompt_id == p)) for p in above] == [2, 4, 8, 0]
    out = refresh(job(tmp_path))  # floor(0.3 * 10) = 3 of the 4 above 1/2
    assert out["plan"]["selected"] == above[:3] and out["collected"] == 3
    got = TrajectoryStore.open(str(tmp_path / "refresh" / "trajectories")).committed_prompt_ids()
    assert sorted(got) == sorted(above[:3])
    plan = json.loads((tmp_path / "refresh" / "plan.json").read_text())
    assert plan["status_change_probability"] == pytest.approx({p: values[p] for p in above[:3]}, rel=1e-9)
    shown = summary(out)
    assert shown["criterion"] == "status" and shown["above"] == 0.5 and "below" not in shown and shown["chosen"] == 3
    with pytest.raises(MismatchError, match="above"):
        refresh(job(tmp_path, above=0.6))


def test_refresh_by_status_threshold_and_columns(tmp_path):
    make_inputs(tmp_path, ROWS)
    out = refresh(job(tmp_path, budget=1.0, above=0.9))
    assert out["plan"]["selected"] == [task_splits()["pool"][2].prompt_id]  # 0.992 is the only one above 0.9
    with pytest.raises(ValidationError, match="needs --below"):
        job(tmp_path, criterion="ess")
    old = tmp_path / "old"
    old.mkdir()
    make_inputs(old, ROWS[:2], with_theta=False)  # p_theta and the mean weight unknown (NaN)
    assert refresh(job(old, budget=1.0))["plan"]["selected"] == []


def test_refresh_of_the_blind_spot_takes_only_reused_all_equal_groups(tmp_path):
    """groups: all_equal (issue 32's revision 10): of the prompts over the threshold, exactly those whose reused
    rewards were all equal (std 0), highest first; a mixed group over it (rows 0 and 4) is never taken. The plan
    records the choice, a rerun with the other refuses by name, and a plan of 'any' keeps its old fields."""
    records = make_inputs(tmp_path, ROWS)
    values = {r.prompt_id: brute_force_value(*row) for r, row in zip(records, ROWS)}
    flat = {r.prompt_id for r, row in zip(records, ROWS) if row[1] == 0}
    want = sorted((p for p, v in values.items() if v > 0.5 and p in flat), key=lambda p: (-values[p], p))
    assert [records.index(next(r for r in records if r.prompt_id == p)) for p in want] == [2, 8]
    out = refresh(job(tmp_path, budget=1.0, groups="all_equal"))
    assert out["plan"]["selected"] == want and out["collected"] == 2
    assert out["plan"]["groups"] == "all_equal" and summary(out)["groups"] == "all_equal"
    with pytest.raises(MismatchError, match="groups"):
        refresh(job(tmp_path, budget=1.0))
    other = tmp_path / "any"
    other.mkdir()
    make_inputs(other, ROWS)
    plan = refresh(job(other, budget=1.0))["plan"]
    assert "groups" not in plan and summary({"plan": plan})["groups"] == "any"
    assert plan["selected"][:2] == [records[2].prompt_id, records[4].prompt_id]  # 0.992, then the mixed 0.851


def test_the_checked_curriculums_refresh_by_name_and_the_folders_of_old_refreshes():
    """check.refresh names the refresh a stage after the first runs; a refresh of groups 'any' records what it
    recorded before the choice existed (its folder key and plan unchanged), 'all_equal' records the choice."""
    from cropi.pipeline.curriculum.config import CHECK_REFRESH
    from cropi.pipeline.requests import RefreshOptions

    assert CHECK_REFRESH["blind_spot"].groups == "all_equal" and CHECK_REFRESH["status"].groups == "any"
    assert CHECK_REFRESH["status"].recorded() == {"criterion": "status", "below": None, "above": 0.5, "budget": 1.0}
    assert CHECK_REFRESH["blind_spot"].recorded()["groups"] == "all_equal"
    with pytest.raises(ValidationError, match="groups"):
        RefreshOptions(criterion="status", budget=1.0, groups="mixed")


# ---------------------------------------------------------------- all-equal groups scoring did not run


def perturbed_copy(model, out, scale=0.3, seed=3):
    """A checkpoint near ``model`` (its weights plus noise): theta != beta, so the weights differ from 1."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, out)
    tensors = load_file(out / "model.safetensors")
    g = torch.Generator().manual_seed(seed)
    save_file({k: v + scale * v.float().std() * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
               for k, v in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    return out


def reused_and_moved(tmp_path):
    """The shipped model, 8 pool prompts' trajectories sampled from it (``tmp_path/pool.jsonl``,
    ``tmp_path/trajectories``), and a checkpoint near it (``perturbed_copy``): (behavior, trajectories, checkpoint)."""
    from cropi.pipeline.collect import CollectJob, collect

    behavior = shipped_model()
    write_jsonl(task_splits()["pool"][:8], str(tmp_path / "pool.jsonl"))
    traj_dir = str(tmp_path / "trajectories")
    collect(CollectJob(model=str(behavior), prompts=str(tmp_path / "pool.jsonl"), out=traj_dir, backend="hf",
                       reward="exact_numeric", sampling=SamplingConfig(samples=4, max_new_tokens=6, temperature=1.0),
                       batch_prompts=8))
    return behavior, traj_dir, perturbed_copy(behavior, tmp_path / "ckpt")


def brute_force_weights(model_path, trajs) -> dict[str, tuple[float, float]]:
    """Prompt id -> (ESS/K, log mean weight) from log w_k = sum_t (log pi - log beta), log pi one unpadded
    sequence at a time (support.ess.teacher_forced), in plain floats."""
    from support.ess import teacher_forced

    from cropi.models.loading import load_causal_lm

    model = load_causal_lm(model_path)
    out = {}
    for t in trajs:
        lw = [sum(a - b for a, b in zip(teacher_forced(model, list(t.prompt_token_ids), list(r)), beh))
              for r, beh in zip(t.responses, t.behavior_logprobs)]
        top, k = max(lw), len(lw)
        w = [math.exp(x - top) for x in lw]
        out[t.prompt_id] = (sum(w) ** 2 / sum(x * x for x in w) / k, top + math.log(sum(w) / k))
    return out


def test_the_all_equal_groups_scoring_did_not_run_are_weighed_for_the_criterion(tmp_path):
    """Scoring runs no forward pass on a group whose rewards are all equal: its ESS/K and log mean weight
    are stored null. Given the trajectory store the gradients came from, the refresh computes them at the
    checkpoint (the values a brute force gives) and both criteria choose as before; without it neither
    criterion chooses them, and the plan and summary count them."""
    from cropi.pipeline.compute_gradients import GradientJob, compute_gradients
    from cropi.pipeline.refresh import select_for_refresh
    from cropi.projection import ProjectionSpec

    behavior, traj_dir, ckpt = reused_and_moved(tmp_path)
    spec = ProjectionSpec(kind="sjlt", dim=4)
    compute_gradients(GradientJob(model=str(ckpt), trajectories=traj_dir, store=str(tmp_path / "grads"), split="pool",
                                  name="ck", projection=spec, gradient_dtype="float32", device="cpu"))
    table = GradientStore(str(tmp_path / "grads")).open_split("ck", spec.spec_id, "pool").read()
    c = table.columns
    flat = [p for p, s in zip(table.prompt_ids, c["status"]) if s == "zero_advantage"]
    assert flat and len(flat) < len(table)  # both kinds of group (fixed seeds)
    rows = {p: i for i, p in enumerate(table.prompt_ids)}
    assert all(math.isnan(table.log_mean_weight[rows[p]]) and math.isnan(table.ess_fraction[rows[p]]) for p in flat)

    trajs = list(TrajectoryStore.open(traj_dir).iter_prompts(table.prompt_ids))
    brute = brute_force_weights(str(ckpt), trajs)
    ess = np.array([brute[p][0] if p in flat else v for p, v in zip(table.prompt_ids, table.ess_fraction)])
    log_mass = np.array([brute[p][1] if p in flat else v for p, v in zip(table.prompt_ids, table.log_mean_weight)])
    status = status_change_probability(c["reward_mean"], c["reward_std"], c["n_responses"], table.p_theta, log_mass)
    assert any(status[rows[p]] > 0 for p in flat)  # theta moved: a fresh all-equal group may now be mixed

    def run(name, **kw):
        return refresh(RefreshJob(model=str(ckpt), prompts=str(tmp_path / "pool.jsonl"),
                                  gradients=str(tmp_path / "grads"), checkpoint="ck", spec_id=spec.spec_id,
                                  out=str(tmp_path / name), backend="hf", reward="exact_numeric",
                                  sampling=SamplingConfig(samples=2, max_new_tokens=2), batch_prompts=8, budget=1.0,
                                  **kw))

    plan = run("by-status", criterion="status", above=0.0, trajectories=traj_dir)["plan"]
    assert plan["selected"] == select_above(table.prompt_ids, status, 0.0, 1.0) and set(flat) & set(plan["selected"])
    assert plan["all_equal_unknown"] == 0
    assert plan["status_change_probability"] == pytest.approx({p: status[rows[p]] for p in plan["selected"]}, rel=1e-4)
    plan = run("by-ess", criterion="ess", below=1.0, trajectories=traj_dir)["plan"]
    assert plan["selected"] == select_for_refresh(table.prompt_ids, ess, 1.0, 1.0) and set(flat) & set(plan["selected"])
    assert plan["ess_fraction"] == pytest.approx({p: ess[rows[p]] for p in plan["selected"]}, rel=1e-4)

    # without the trajectories: unknown, never chosen, and counted
    plan = run("by-ess-alone", criterion="ess", below=1.0)["plan"]
    assert plan["selected"] == [p for p in select_for_refresh(table.prompt_ids, ess, 1.0, 1.0) if p not in flat]
    out = run("by-status-alone", criterion="status", above=0.0)
    assert out["plan"]["selected"] == [p for p in select_above(table.prompt_ids, status, 0.0, 1.0) if p not in flat]
    assert summary(out)["all_equal_unknown"] == out["plan"]["all_equal_unknown"] == len(flat)
    # the weights are the gradients' own: another checkpoint or another trajectory store is refused
    with pytest.raises(MismatchError, match="not the checkpoint"):
        refresh(RefreshJob(model=str(behavior), prompts=str(tmp_path / "pool.jsonl"),
                           gradients=str(tmp_path / "grads"), checkpoint="ck", spec_id=spec.spec_id,
                           out=str(tmp_path / "other"), criterion="status", budget=1.0, trajectories=traj_dir))
    with pytest.raises(MismatchError, match="not the trajectory store"):
        run("other-store", criterion="status", trajectories=str(tmp_path / "by-status" / "trajectories"))


def test_the_all_equal_groups_are_weighed_in_the_dtype_and_attention_their_gradients_ran_in(tmp_path, monkeypatch):
    """Gradients taken with the model in bfloat16 (the CUDA default) record it; the refresh weighs the groups
    scoring did not run in the same dtype and attention, not in float32: on CUDA several times slower, and
    not the precision of the other groups' weights. Without a record (float32, eager) it loads as before."""
    import cropi.models.loading as loading
    from cropi.gradients.options import ModelOptions
    from cropi.pipeline.compute_gradients import GradientJob, compute_gradients
    from cropi.projection import ProjectionSpec

    _, traj_dir, ckpt = reused_and_moved(tmp_path)
    spec = ProjectionSpec(kind="sjlt", dim=4)
    loads = []
    real = loading.load_causal_lm
    monkeypatch.setattr(loading, "load_causal_lm", lambda path, **kw: (loads.append(kw), real(path, **kw))[1])
    for name, options in (("bf16", ModelOptions(model_dtype="bfloat16", attention="sdpa")), ("f32", ModelOptions())):
        compute_gradients(GradientJob(model=str(ckpt), trajectories=traj_dir, store=str(tmp_path / "grads"),
                                      split="pool", name=name, projection=spec, gradient_dtype="float32",
                                      device="cpu", model_options=options))
        loads.clear()
        plan = refresh(RefreshJob(model=str(ckpt), prompts=str(tmp_path / "pool.jsonl"),
                                  gradients=str(tmp_path / "grads"), checkpoint=name, spec_id=spec.spec_id,
                                  out=str(tmp_path / f"refresh-{name}"), backend="hf", reward="exact_numeric",
                                  sampling=SamplingConfig(samples=2, max_new_tokens=2), batch_prompts=8,
                                  criterion="status", above=0.0, budget=1.0, trajectories=traj_dir))["plan"]
        assert plan["all_equal_unknown"] == 0 and plan["selected"]
        weighed = loads[0]  # the weighing's load comes first: the collection's engine starts after it
        want = ("bfloat16", "sdpa") if name == "bf16" else ("float32", "eager")
        assert (str(weighed["dtype"]), weighed["attn_implementation"]) == want, weighed
