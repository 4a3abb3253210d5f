"""Refresh by ESS: exactly the prompts below the threshold within the budget, and a killed refresh resumes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cropi.demo.assets import shipped_model
from cropi.errors import InvalidInputError, MismatchError
from cropi.generation import SamplingConfig
from cropi.pipeline.refresh import RefreshJob, refresh, select_for_refresh
from cropi.store import GradientStore, TrajectoryStore
from support.refresh import make_inputs


def test_selection_is_below_threshold_lowest_first_within_budget():
    ids = [f"p{i}" for i in range(10)]
    ess = [0.9, 0.1, 0.45, np.nan, 0.3, 0.5, 0.05, 0.2, 1.0, 0.49]
    # below 0.5: p6 .05, p1 .1, p7 .2, p4 .3, p2 .45, p9 .49 (p5 = 0.5 is not below; NaN never)
    assert select_for_refresh(ids, ess, 0.5, 1.0) == ["p6", "p1", "p7", "p4", "p2", "p9"]
    assert select_for_refresh(ids, ess, 0.5, 0.3) == ["p6", "p1", "p7"]   # floor(0.3 * 10) = 3
    assert select_for_refresh(ids, ess, 0.5, 0.09) == []                  # floor(0.9) = 0
    assert select_for_refresh(ids, ess, 0.05, 1.0) == []                  # strictly below
    with pytest.raises(InvalidInputError, match="ESS values"):
        select_for_refresh(ids, ess[:3], 0.5, 1.0)


def job(tmp_path, **kw):
    return RefreshJob(model=str(shipped_model()), prompts=str(tmp_path / "pool.jsonl"), gradients=str(tmp_path / "grads"),
                      checkpoint="ck", spec_id="s4", split="pool", out=str(tmp_path / "refresh"),
                      below=kw.pop("below", 0.5), budget=kw.pop("budget", 0.3), backend="hf", reward="exact_numeric",
                      sampling=SamplingConfig(samples=2, max_new_tokens=4), batch_prompts=1, **kw)


class Killed(Exception):
    pass


def test_refresh_collects_exactly_the_chosen_prompts_and_a_killed_run_resumes(tmp_path):
    ess = [0.9, 0.1, 0.45, None, 0.3, 0.6, 0.05, 0.2, 1.0, 0.7]
    records = make_inputs(tmp_path, ess)
    want = [records[i].prompt_id for i in (6, 1, 7)]  # below 0.5, lowest first, floor(0.3 * 10) = 3

    def die_after_first_prompt(stage, done, total):
        if done >= 1:
            raise Killed

    with pytest.raises(Killed):
        refresh(job(tmp_path), progress=die_after_first_prompt)
    store = TrajectoryStore.open(str(tmp_path / "refresh" / "trajectories"))
    assert len(store.committed_prompt_ids()) == 1
    plan_text = (tmp_path / "refresh" / "plan.json").read_text()

    out = refresh(job(tmp_path))
    assert out["plan"]["selected"] == want and out["collected"] == 2 and out["skipped"] == 1
    assert (tmp_path / "refresh" / "plan.json").read_text() == plan_text  # the choice was frozen
    got = list(TrajectoryStore.open(str(tmp_path / "refresh" / "trajectories")).iter_prompts())
    assert sorted(t.prompt_id for t in got) == sorted(want) and all(len(t.responses) == 2 for t in got)
    plan = json.loads(plan_text)
    assert plan["ess_fraction"] == {records[6].prompt_id: 0.05, records[1].prompt_id: 0.1, records[7].prompt_id: 0.2}
    assert plan["pool_size"] == 10 and math.isclose(plan["budget"], 0.3)
    # resuming with other settings is refused, and nothing is collected
    with pytest.raises(MismatchError, match="below"):
        refresh(job(tmp_path, below=0.4))


def test_refresh_needs_gradients_stored_with_ess(tmp_path):
    make_inputs(tmp_path, [None, None])
    table = GradientStore(str(tmp_path / "grads")).open_split("ck", "s4", "pool").read()
    assert np.isnan(table.ess_fraction).all()
    out = refresh(job(tmp_path, budget=1.0))  # unknown ESS is never below the threshold
    assert out["plan"]["selected"] == [] and out["collected"] == 0
