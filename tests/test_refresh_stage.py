"""The curriculum's per-stage refresh: a split's rows replaced by recomputed ones, and a CROPI stage
that re-collects the prompts its criterion picks at theta_m and ranks them from their fresh gradients.

Collection and gradients are real (a tiny random model, the hf backend); the trainer is the
curriculum tests' stand-in that perturbs the weights, so theta_1 differs from the behavior policy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cropi.data import load_prompts, write_jsonl
from cropi.errors import MismatchError
from cropi.models import build_tiny_model
from cropi.pipeline.curriculum import CurriculumConfig, CurriculumConfigError, run_curriculum
from cropi.pipeline.curriculum import loop
from cropi.pipeline.refresh import select_above, status_change_probability
from cropi.rewards import register_reward
from cropi.store import CheckpointRef, GradientStore, TrajectoryStore
from cropi.store.gradient_table import GradientTable
from cropi.trainers import StageResult
from support.curriculum import FakeTrainer

POOL, VAL, BUDGET = 24, 12, 0.25
REWARD = "cropi_test_refresh_even_length"


@register_reward(REWARD, replace=True)
def even_length(text: str, answer: str) -> float:
    return 1.0 if len(text) % 2 == 0 else 0.0


# ---------------------------------------------------------------- replacing rows


def table(ids, vectors, ess, split="pool", fingerprint="f", spec_id="s"):
    vectors = np.asarray(vectors, dtype=np.float32)
    return GradientTable(list(ids), vectors, {"status": np.array(["ok"] * len(ids), dtype=object),
                                              "ess": np.asarray(ess, dtype=np.float64)},
                         CheckpointRef(name="c", fingerprint=fingerprint), {"spec_id": spec_id}, split)


def test_replace_rows_puts_the_others_rows_in_place_and_keeps_the_order():
    pool = table(["a", "b", "c", "d"], [[1, 0], [2, 0], [3, 0], [4, 0]], [1, 2, 3, 4])
    fresh = table(["d", "b"], [[0, 40], [0, 20]], [8, 8], split="refresh")
    out = pool.replace_rows(fresh)
    assert out.prompt_ids == ["a", "b", "c", "d"]
    assert out.vectors.tolist() == [[1, 0], [0, 20], [3, 0], [0, 40]]
    assert out.columns["ess"].tolist() == [1, 8, 3, 8]
    assert pool.vectors.tolist() == [[1, 0], [2, 0], [3, 0], [4, 0]]  # the original is left as it was


def test_replace_rows_refuses_foreign_prompts_and_other_checkpoints():
    pool = table(["a", "b"], [[1, 0], [2, 0]], [1, 2])
    with pytest.raises(MismatchError, match="not in split 'pool'"):
        pool.replace_rows(table(["z"], [[0, 1]], [1], split="refresh"))
    with pytest.raises(MismatchError, match="not comparable"):
        pool.replace_rows(table(["a"], [[0, 1]], [1], split="refresh", fingerprint="other"))


# ---------------------------------------------------------------- a curriculum stage with refresh


class PerturbingTrainer(FakeTrainer):
    """FakeTrainer's release, with a larger perturbation seeded per stage."""

    def train_stage(self, *, model, subset, out_dir, steps, seed, stage, reward) -> StageResult:
        import shutil

        import torch
        from safetensors.torch import load_file, save_file

        ckpt = Path(out_dir) / "checkpoint"
        shutil.copytree(model, ckpt)
        tensors = load_file(ckpt / "model.safetensors")
        g = torch.Generator().manual_seed(7 + stage)
        save_file({k: v + 0.2 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                   for k, v in tensors.items()}, ckpt / "model.safetensors", metadata={"format": "pt"})
        (Path(out_dir) / "train.log").write_text("")
        return StageResult(checkpoint=str(ckpt), steps_done=steps, global_step=(stage + 1) * steps, stage=stage,
                           metrics={}, log_path=str(Path(out_dir) / "train.log"))


@pytest.fixture(scope="module")
def refreshed_run(tmp_path_factory):
    from cropi.tasks.arithmetic import make_task_splits

    base = tmp_path_factory.mktemp("refresh-stage")
    splits = make_task_splits(7, pool_size=POOL, val_size=VAL, test_size=2)
    files = {}
    for name in ("pool", "val_a"):
        files[name] = str(base / f"{name}.jsonl")
        write_jsonl(splits[name], files[name])
    config = CurriculumConfig.model_validate(dict(
        name="refreshed", model=str(build_tiny_model(base / "model", size="tiny", seed=0)), pool=files["pool"],
        validation={"val_a": files["val_a"]}, stages=2, select_fraction=0.25, steps_per_stage=1, trainer="fake",
        selector="cropi",
        reward=REWARD, loss={"advantage": "theta"},
        refresh={"criterion": "status", "above": 0.0, "budget": BUDGET},
        collect=dict(pool_samples=4, validation_samples=4, temperature=1.0, max_new_tokens=6, backend="hf",
                     batch_prompts=16),
        projection=dict(kind="sjlt", dim=32, kept_fraction=0.5), gradient_dtype="float32", device="cpu"))
    root = base / "root"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "make_trainer", lambda name, **options: PerturbingTrainer())
        result = run_curriculum(config, root=root)
    state = json.loads((root / "curricula" / "refreshed" / "state.json").read_text())
    return config, root, result, state


def test_the_first_stage_is_not_refreshed(refreshed_run):
    _, root, result, state = refreshed_run
    assert result["stages"][0]["refreshed"] is None  # theta_0 is the behavior policy: nothing is stale
    assert state["stages"][0]["scored"]["ranking"].endswith("/pool.cropi.parquet")  # cropi is not the default selector


def test_a_later_stage_refreshes_exactly_what_its_criterion_names_within_the_budget(refreshed_run):
    config, root, result, state = refreshed_run
    scored = state["stages"][1]["scored"]
    gs = GradientStore(str(root / "store"))
    pool = gs.open_split(scored["checkpoint"], scored["spec_id"], "pool").read()
    c = pool.columns
    values = status_change_probability(c["reward_mean"], c["reward_std"], c["n_responses"], pool.p_theta,
                                       pool.log_mean_weight)
    want = select_above(pool.prompt_ids, values, 0.0, BUDGET)
    assert 0 < len(want) <= math.floor(BUDGET * POOL)
    plan_files = list((root / "refresh").glob(f"{scored['checkpoint']}-*/plan.json"))
    assert len(plan_files) == 1
    plan = json.loads(plan_files[0].read_text())
    assert plan["selected"] == want and plan["model"] == scored["model"]
    assert result["stages"][1]["refreshed"] == len(want) == scored["refreshed"]
    fresh = TrajectoryStore.open(str(plan_files[0].parent / "trajectories"))
    assert fresh.committed_prompt_ids() == set(want)
    assert all(len(t.rewards) == config.collect.pool_samples for t in fresh.iter_prompts())


def test_the_stage_ranks_refreshed_prompts_from_their_fresh_on_policy_gradients(refreshed_run):
    _, root, result, state = refreshed_run
    scored = state["stages"][1]["scored"]
    ranking = pq.read_table(scored["ranking"])
    meta = json.loads(ranking.schema.metadata[b"cropi.ranking"])
    split = meta["replaced_by"]
    assert Path(scored["ranking"]).name == f"{split}.cropi.parquet"  # named for its selector (not the default)
    assert (Path(scored["ranking"]).parent / "pool.cropi.parquet").is_file()  # the pool's own ranking is kept
    gs = GradientStore(str(root / "store"))
    pool = gs.open_split(scored["checkpoint"], scored["spec_id"], "pool").read()
    fresh = gs.open_split(scored["checkpoint"], scored["spec_id"], split).read()
    # sampled at theta_1 and scored at theta_1: every importance weight is 1
    assert np.allclose(fresh.ess_fraction[np.isfinite(fresh.ess_fraction)], 1.0)
    val = gs.open_split(scored["checkpoint"], scored["spec_id"], "val_a").read()
    ok = [i for i, s in enumerate(val.columns["status"]) if s == "ok"]
    target = np.asarray(val.vectors, np.float64)[ok].mean(axis=0)
    rows = {p: (np.asarray(v, np.float64), s) for p, v, s in zip(pool.prompt_ids, pool.vectors, pool.columns["status"])}
    rows |= {p: (np.asarray(v, np.float64), s) for p, v, s in zip(fresh.prompt_ids, fresh.vectors, fresh.columns["status"])}
    scores = dict(zip(ranking["prompt_id"].to_pylist(), ranking["score:val_a"].to_pylist()))
    changed = 0
    for pid, (v, status) in rows.items():
        if status == "ok":
            assert scores[pid] == pytest.approx(v @ target / (np.linalg.norm(v) * np.linalg.norm(target)),
                                                rel=1e-4, abs=1e-6)
        else:
            assert scores[pid] is None or not math.isfinite(scores[pid])
    for pid in fresh.prompt_ids:
        old = pool.vectors[pool.prompt_ids.index(pid)]
        changed += not np.allclose(old, fresh.vectors[fresh.prompt_ids.index(pid)])
    assert changed > 0  # the fresh trajectories gave other gradients than the reused ones
    # the stage selected the refreshed ranking's top fraction, best first
    ok_rows = sorted((r for r in ranking.to_pylist() if r["status"] == "ok" and math.isfinite(r["fused"])),
                     key=lambda r: (-r["fused"], r["prompt_id"]))
    subset = [r.prompt_id for r in load_prompts(state["stages"][1]["selected"]["subset"])]
    assert subset == [r["prompt_id"] for r in ok_rows[:math.ceil(0.25 * POOL)]]


@pytest.mark.parametrize("selector,fraction", [("diverse", 0.25), ("cropi", 0.5), ("positive", 0.25)])
def test_another_arm_re_ranks_the_stored_refresh_and_selects_what_scoring_again_would(refreshed_run, monkeypatch,
                                                                                      selector, fraction):
    """A checked stage's other arm (or a widened subset) at a refreshed stage: ``select_ids`` re-ranks from the
    store (``reselect``) and picks what scoring the checkpoint again with that selector picks, from the
    ranking with the refreshed prompts' fresh rows. The mistakes this catches: ranking the pool's stale rows
    (the refresh split dropped), which picks otherwise here, and any collection or gradient work redone."""
    from cropi.pipeline import score as score_step
    from cropi.pipeline.curriculum import steps
    from cropi.pipeline.curriculum.state import CurriculumPaths

    config, root, _, state = refreshed_run
    scored = state["stages"][1]["scored"]
    assert scored["replaced_by"] and scored["replaced_by"].startswith("refresh-")
    pool = {r.prompt_id: r for r in load_prompts(config.pool)}
    paths = CurriculumPaths(root, config.name)
    args = (config, paths, 1, pool, scored["model"], selector, fraction)
    again = steps.select_ids(*args)  # no record: the stage scored again with this selector
    stale = steps.select_ids(*args, scored | {"replaced_by": None})  # the refresh split left out
    with monkeypatch.context() as mp:
        for name in ("compute_gradients", "ensure_trajectories", "_refresh"):
            mp.setattr(score_step, name, lambda *a, **k: pytest.fail("re-ranking a scored stage recomputed"))
        fast = steps.select_ids(*args, scored)
    assert steps.select_ids(*args, scored | {"model": "/another/theta"}) == again  # not this model's: scored again
    assert steps.select_ids(*args, scored | {"checkpoint": "gone-00000000"}) == again  # not in the store: likewise
    assert fast == again and len(fast) > 0
    if selector == "cropi":
        assert stale != fast  # the refreshed rows move CROPI's pick on this fixture


@pytest.mark.parametrize("change", [{"method": "random"}, {"recollect_each_stage": True}])
def test_refresh_needs_cropi_over_reused_trajectories(change):
    fields = dict(name="x", model="/m", pool="/p", validation={"v": "/v"},
                  refresh={"criterion": "status", "budget": 0.2}) | change
    with pytest.raises(CurriculumConfigError, match="'refresh' re-collects"):
        CurriculumConfig.parse(fields)


def test_refresh_by_ess_needs_its_threshold():
    with pytest.raises(CurriculumConfigError, match="needs --below"):
        CurriculumConfig.parse(dict(name="x", model="/m", pool="/p", validation={"v": "/v"},
                                    refresh={"criterion": "ess", "budget": 0.2}))
