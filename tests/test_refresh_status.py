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
