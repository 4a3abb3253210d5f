"""The curriculum job: stages complete, resume at stage granularity, subsets and baselines are right.

Collection and gradients are real (a tiny random model, the hf backend); the
trainer is a stand-in that perturbs the weights, so a stage takes milliseconds
and the tests can count its calls and make it fail.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cropi.cli import main as cli_main
from cropi.data import load_prompts
from cropi.errors import InvalidInputError
from cropi.pipeline import score
from cropi.selection import DEFAULT_SELECTOR, SelectionInputs, select
from cropi.pipeline.curriculum import (CurriculumConfig, CurriculumConfigError, CurriculumConflictError,
                                       run_curriculum, stage_seed)
from cropi.pipeline.curriculum.check import CheckOptions
from cropi.store import GradientStore, TrajectoryStore
from cropi.utils.fingerprint import model_fingerprint
from support.curriculum import FRACTION, POOL, REWARD, FakeTrainer, build_setup, make_config, use_trainer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return build_setup(tmp_path_factory.mktemp("curriculum"))


@pytest.fixture(scope="module")
def cropi_run(setup):
    trainer = FakeTrainer()
    engines = []
    real = score.make_backend
    with pytest.MonkeyPatch.context() as mp:
        use_trainer(mp, trainer)
        mp.setattr(score, "make_backend", lambda *a, **kw: engines.append(a) or real(*a, **kw))
        # theta_0's reused groups ranked at each stage, as the tests below read them (the pool split at theta_m);
        # the check's refresh (revision 9's default) has its own tests: test_refresh_stage.py, test_check.py
        result = run_curriculum(make_config(setup, check={"refresh": "never"}), root=setup["root"])
    return result, trainer, engines


def brute_force_top(table, fraction: float, pool_size: int) -> list[str]:
    """ok rows by fused score, best first, ties by prompt_id; ceil(fraction * pool) of them."""
    rows = [r for r in table.to_pylist() if r["status"] == "ok" and math.isfinite(r["fused"])]
    rows.sort(key=lambda r: (-r["fused"], r["prompt_id"]))
    return [r["prompt_id"] for r in rows[:math.ceil(fraction * pool_size)]]


# ---------------------------------------------------------------- a two-stage CROPI curriculum


def test_two_stages_complete_and_chain_checkpoints(setup, cropi_run):
    result, trainer, engines = cropi_run
    # trajectories come from the initial model, sampled once (one engine) and reused at stage 1
    assert [a[1] for a in engines] == [str(Path(setup["model"]).resolve())]
    assert result["finished"] and [s["index"] for s in result["stages"]] == [0, 1]
    assert [c["stage"] for c in trainer.calls] == [0, 1]
    assert trainer.calls[0]["model"] == str(Path(setup["model"]).resolve())
    assert trainer.calls[1]["model"] == result["stages"][0]["checkpoint"]
    assert [c["seed"] for c in trainer.calls] == [stage_seed(1, 0), stage_seed(1, 1)]
    assert all(c["steps"] == 3 and c["reward"] == REWARD for c in trainer.calls)
    assert result["final_checkpoint"] == result["stages"][1]["checkpoint"]
    state = json.loads((Path(setup["root"]) / "curricula" / "cropi-run" / "state.json").read_text())
    assert all({"scored", "selected", "trained"} <= set(s) for s in state["stages"])
    assert state["stages"][0]["trained"]["metrics"]["loss_last"] is None  # NaN stored as null


def test_stage_subsets_are_verl_parquet_of_exactly_the_selected_prompts(setup, cropi_run):
    result, _, _ = cropi_run
    pool = {r.prompt_id: r for r in load_prompts(setup["files"]["pool"])}
    for stage in result["stages"]:
        ranking = pq.read_table(stage["ranking"])
        want = brute_force_top(ranking, FRACTION, POOL)
        assert 0 < len(want) <= math.ceil(FRACTION * POOL)
        got = load_prompts(stage["subset"])
        assert [r.prompt_id for r in got] == want
        assert stage["n_prompts"] == len(want)
        assert got == [pool[p] for p in want]  # prompt, answer, data_source and extra_info survive
        table = pq.read_table(stage["subset"])
        assert set(table.column_names) >= {"prompt", "data_source", "reward_model", "extra_info"}
        assert table["reward_model"].to_pylist()[0]["ground_truth"] == pool[want[0]].answer
        assert sorted(ranking.filter(ranking["selected"])["prompt_id"].to_pylist()) == sorted(want)


def test_a_later_stage_record_compares_its_ranking_with_the_last_stages(setup, cropi_run):
    """Stage 1's record (and the curriculum's answer) holds Spearman's rho between its stored ranking and stage 0's
    over the prompts both ranked, recomputed here from the two files by ranks; stage 0 has nothing to compare."""
    from scipy.stats import rankdata

    result, _, _ = cropi_run
    first, second = result["stages"]
    assert "ranking_change" not in first["selection"]
    fused = [{r["prompt_id"]: r["fused"] for r in pq.read_table(s["ranking"]).to_pylist() if r["status"] == "ok"}
             for s in (first, second)]
    common = sorted(set(fused[0]) & set(fused[1]))
    a, b = (rankdata([f[p] for p in common]) for f in fused)
    rho = float(np.corrcoef(a, b)[0, 1])
    change = second["selection"]["ranking_change"]
    assert change["prompts"] == len(common) and change["spearman"] == pytest.approx(rho, abs=1e-9)
    turned = "ranking_turned_over" in [w["code"] for w in second["selection"]["warnings"]]
    assert turned == (rho * math.sqrt(len(common) - 1) <= 1.6448536269514722)


def test_each_stage_is_scored_at_its_own_checkpoint(setup, cropi_run):
    """Stage m's ranking is the cosine of stored pool gradients at theta_m with the mean validation gradient."""
    result, _, _ = cropi_run
    store = GradientStore(str(Path(setup["root"]) / "store"))
    seen = set()
    for stage in result["stages"]:
        ranking = pq.read_table(stage["ranking"])
        meta = json.loads(ranking.schema.metadata[b"cropi.ranking"])
        assert meta["checkpoint"].startswith(model_fingerprint(stage["model"]))
        seen.add(meta["checkpoint"])
        pool = store.open_split(meta["checkpoint"], meta["spec_id"], "pool").read()
        vectors = dict(zip(pool.prompt_ids, np.asarray(pool.vectors, dtype=np.float64)))
        scores = dict(zip(ranking["prompt_id"].to_pylist(), ranking["score:val_a"].to_pylist()))
        val = store.open_split(meta["checkpoint"], meta["spec_id"], "val_a").read()
        ok = [i for i, s in enumerate(val.columns["status"]) if s == "ok"]
        target = np.asarray(val.vectors, dtype=np.float64)[ok].mean(axis=0)
        for pid, status in zip(pool.prompt_ids, pool.columns["status"]):
            if status == "ok":
                v = vectors[pid]
                want = v @ target / (np.linalg.norm(v) * np.linalg.norm(target))
                assert scores[pid] == pytest.approx(want, rel=1e-4, abs=1e-6)
            else:
                assert scores[pid] is None or not math.isfinite(scores[pid])
    assert len(seen) == 2  # two checkpoints, two sets of gradients


def test_interrupted_run_resumes_without_redoing_finished_stages(setup, monkeypatch):
    config = make_config(setup, name="resumed")
    crashing = use_trainer(monkeypatch, FakeTrainer(fail_at_stage=1))
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_curriculum(config, root=setup["root"])
    state_path = Path(setup["root"]) / "curricula" / "resumed" / "state.json"
    before = json.loads(state_path.read_text())
    assert set(before["stages"][0]) >= {"scored", "selected", "trained"}
    assert "trained" not in before["stages"][1] and "selected" in before["stages"][1]
    assert [c["stage"] for c in crashing.calls] == [0, 1]

    fresh = use_trainer(monkeypatch, FakeTrainer())
    result = run_curriculum(config, root=setup["root"])
    after = json.loads(state_path.read_text())
    assert [c["stage"] for c in fresh.calls] == [1]  # stage 0 was not trained again
    assert fresh.calls[0]["model"] == before["stages"][0]["trained"]["checkpoint"]
    for step in ("scored", "selected", "trained"):
        assert after["stages"][0][step]["at"] == before["stages"][0][step]["at"]
    for step in ("scored", "selected"):
        assert after["stages"][1][step]["at"] == before["stages"][1][step]["at"]
    assert result["finished"] and result["stages"][1]["checkpoint"]


def test_a_subset_smaller_than_the_trainers_batch_is_filled_to_one_and_says_so(setup, monkeypatch):
    """ceil(0.25 * 24) = 6 picks against a batch of 10 distinct prompts a step: the trainers refuse a smaller subset,
    so the stage trains the 6 picks first and 4 uniform draws from the rest of the pool, and its record says so."""
    from types import SimpleNamespace

    from cropi.scoring.diagnostics import FILLED_TO_BATCH

    trainer = use_trainer(monkeypatch, FakeTrainer())
    trainer.options = SimpleNamespace(batch_prompts=10)
    result = run_curriculum(make_config(setup, name="small-batch", method="random", stages=1), root=setup["root"])
    pool_ids = [r.prompt_id for r in load_prompts(setup["files"]["pool"])]
    picks = select("random", SelectionInputs(pool_ids, FRACTION, seed=1, salt="0")).chosen
    trained = [r.prompt_id for r in load_prompts(result["stages"][0]["subset"])]
    assert len(picks) == math.ceil(FRACTION * POOL) == 6
    assert trained[:6] == picks and len(trained) == len(set(trained)) == 10 and set(trained) <= set(pool_ids)
    state = json.loads((Path(setup["root"]) / "curricula" / "small-batch" / "state.json").read_text())
    selected = state["stages"][0]["selected"]
    assert selected["filled"] == 4 and selected["n_prompts"] == 10
    warning = next(w for w in selected["diagnostics"]["warnings"] if w["code"] == FILLED_TO_BATCH)
    assert (warning["selected"], warning["batch"], warning["filled"]) == (6, 10, 4)

    trainer.options = SimpleNamespace(batch_prompts=POOL + 1)  # not even the pool fills a batch: refused first
    with pytest.raises(InvalidInputError, match=f"has {POOL} prompts, fewer than one step's batch.*at most {POOL}"):
        run_curriculum(make_config(setup, name="pool-below-batch", stages=1), root=setup["root"])
    assert not (Path(setup["root"]) / "curricula" / "pool-below-batch").exists()  # before any work


def test_more_stages_extend_a_run_and_other_changes_are_refused(setup, monkeypatch):
    trainer = use_trainer(monkeypatch, FakeTrainer())
    config = make_config(setup, name="extended", method="random", stages=1)
    run_curriculum(config, root=setup["root"])
    run_curriculum(config.model_copy(update={"stages": 2}), root=setup["root"])
    assert [c["stage"] for c in trainer.calls] == [0, 1]
    with pytest.raises(CurriculumConflictError, match="another config"):
        run_curriculum(config.model_copy(update={"select_fraction": 0.5}), root=setup["root"])


# ---------------------------------------------------------------- baselines


def test_baseline_runs_select_as_specified(setup, monkeypatch):
    use_trainer(monkeypatch, FakeTrainer())
    pool_ids = [r.prompt_id for r in load_prompts(setup["files"]["pool"])]
    full = run_curriculum(make_config(setup, name="full", method="full", stages=1), root=setup["root"])
    assert [r.prompt_id for r in load_prompts(full["stages"][0]["subset"])] == pool_ids

    rand = run_curriculum(make_config(setup, name="rand", method="random"), root=setup["root"])
    subsets = [[r.prompt_id for r in load_prompts(s["subset"])] for s in rand["stages"]]
    assert all(len(s) == len(set(s)) == math.ceil(FRACTION * POOL) and set(s) <= set(pool_ids) for s in subsets)
    assert subsets[0] == select("random", SelectionInputs(pool_ids, FRACTION, seed=1, salt="0")).chosen

    pr = run_curriculum(make_config(setup, name="pr", method="pass_rate", stages=1), root=setup["root"])
    # brute force from the raw trajectory rows (the behavior policy is the initial model)
    traj = [p for p in (Path(setup["root"]) / "trajectories").glob("*/pool")
            if TrajectoryStore.open(str(p)).identity["sampling"]["samples"] == 4]
    rows = TrajectoryStore.open(str(traj[0])).read_table().to_pylist()
    rewards: dict[str, list] = {}
    for r in rows:
        rewards.setdefault(r["prompt_id"], []).append(r["reward"])
    score = {p: (sum(v) / len(v)) * (1 - sum(v) / len(v)) for p, v in rewards.items()}
    chosen = [r.prompt_id for r in load_prompts(pr["stages"][0]["subset"])]
    useful = [p for p in pool_ids if score[p] > 0]
    assert len(chosen) == min(len(useful), math.ceil(FRACTION * POOL))
    assert all(score[p] > 0 for p in chosen)
    rest = [score[p] for p in useful if p not in chosen]
    assert not rest or min(score[p] for p in chosen) >= max(rest)


# ---------------------------------------------------------------- config and doors


def test_config_from_yaml_resolves_relative_paths_and_aliases(setup, tmp_path):
    folder = Path(setup["base"])
    cfg_file = folder / "c.yaml"
    cfg_file.write_text("name: from-yaml\nmodel: model\npool: pool.jsonl\nvalidation: {val_a: val_a.jsonl}\n"
                        "fraction: 0.2\nspec: {dim: 64}\nmethod: random\n")
    cfg = CurriculumConfig.from_file(cfg_file)
    assert cfg.model == str((folder / "model").resolve()) and cfg.pool == str((folder / "pool.jsonl").resolve())
    assert cfg.select_fraction == 0.2 and cfg.projection.dim == 64
    assert CurriculumConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # the service round-trips it
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "model": "m", "pool": "p", "method": "cropi"}))
    with pytest.raises(CurriculumConfigError, match="validation"):
        CurriculumConfig.from_file(bad)
    bad.write_text(json.dumps({"name": "x", "model": "m", "pool": "p", "method": "random", "stagez": 2}))
    with pytest.raises(CurriculumConfigError, match="stagez"):
        CurriculumConfig.from_file(bad)
    with pytest.raises(CurriculumConfigError, match="does not exist"):
        CurriculumConfig.from_file(tmp_path / "missing.yaml")


def test_cli_runs_a_curriculum(setup, monkeypatch, capsys):
    trainer = use_trainer(monkeypatch, FakeTrainer())
    cfg_file = Path(setup["base"]) / "cli.json"
    cfg_file.write_text(make_config(setup, name="cli", method="full", stages=1).model_dump_json())
    assert cli_main(["curriculum", "--config", str(cfg_file), "--root", setup["root"], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finished"] and out["stages"][0]["n_prompts"] == POOL and len(trainer.calls) == 1
    assert cli_main(["curriculum", "--config", str(cfg_file) + ".missing", "--root", setup["root"]]) == 2


# ---------------------------------------------------------------- compatibility with curricula started earlier


def test_a_curriculum_that_named_todays_default_before_it_was_the_default_resumes(tmp_path):
    """A curriculum started naming ``check.race_length: sequential`` while ``part`` was the default stored a key with
    it; today ``sequential`` is the default and drops out of the key, so the same config was refused as "started
    with another config" (round 20 met this resuming round 19's runs). Keys computed by that code: at 87c94ae
    (before revision 19) naming race_length sequential, and at ddfb16b~1 (before revision 16) naming widen_when
    stalled. Both resume today's config, which holds both at their default; another config's key (race_length
    half at ddfb16b~1) does not, and a config that changed one of them resumes neither. So do one named
    ``race_sample: rest`` at ecbe0d1, before revision 22, one named ``race_no_gain: restart`` at 50459a6, before
    revision 24, one named ``race_gain: resolved`` at 2d973e6, before revision 25, one named ``no_gain_draw:
    mixed`` at d412228, before revision 26, and one named ``race_futility: stop`` at 800dbd0, before revision 27.
    One named ``race_no_gain:
    pool`` (at 6253806, before revision 23) names what is no longer the default, and keeps its own key."""
    from cropi.pipeline.curriculum.state import CurriculumPaths, StageState

    cfg = CurriculumConfig.model_validate(dict(
        name="pinned", model="/m", pool="/p", validation={"v": "/v"}, stages=2, select_fraction=0.2, method="cropi",
        reward="exact_numeric", collect=dict(pool_samples=4, temperature=1.0, backend="hf",
                                             backend_options={"max_batch_rows": 8}),
        projection=dict(kind="sjlt", dim=64, kept_fraction=0.1), gradient_dtype="float32"))
    keys = cfg.resume_keys()
    assert cfg.resume_key() == "33b13f976f82e4b9" and len(keys) == 2 ** 10  # every option of CHANGED_DEFAULTS
    assert {"01b5f63c8b4d4c64", "1f08a154b0ea6b4f"} <= keys and "ae5c09f0f29e2398" not in keys
    assert "067642699839bacc" in keys  # at ecbe0d1 (before revision 22) naming race_sample rest (round 21's runs)
    assert "a84c198a2b41fd55" in keys  # at 50459a6 (before revision 24) naming race_no_gain restart (round 24's runs)
    assert "e3d3ac5308975799" in keys  # at 2d973e6 (before revision 25) naming race_gain resolved (round 25's runs)
    assert "ec78b99a522d3c01" in keys  # at d412228 (before revision 26) naming no_gain_draw mixed (round 27's runs)
    assert "e133231096a4e46e" in keys  # at 800dbd0 (before revision 27) naming race_futility stop (round 29's runs)
    pool = cfg.model_copy(update={"check": CheckOptions(race_no_gain="pool")})
    assert "afa71164fee6b8ab" not in keys and pool.resume_key() == "afa71164fee6b8ab"  # at 6253806 and since
    part = cfg.model_copy(update={"check": CheckOptions(race_length="part")})
    assert not {"01b5f63c8b4d4c64", "33b13f976f82e4b9"} & part.resume_keys()
    paths = CurriculumPaths(tmp_path, "pinned")
    paths.state.parent.mkdir(parents=True)
    for key, resumes in (("01b5f63c8b4d4c64", True), ("ae5c09f0f29e2398", False)):
        paths.state.write_text(json.dumps({"version": 1, "name": "pinned", "resume_key": key, "stages": []}))
        if resumes:
            assert StageState.open(paths, cfg).doc["resume_key"] == key  # kept as stored
        else:
            with pytest.raises(CurriculumConflictError, match="started with another config"):
                StageState.open(paths, cfg)


def test_resume_key_store_paths_and_names_are_those_of_the_original_code(tmp_path, monkeypatch):
    """Values computed by the code before the score step was unified (commit 12489f8), so
    curricula started then resume, and find their trajectories and gradients, after it.

    The store paths hash the model's fingerprint. They were computed with ``build_tiny_model(seed=0)``
    under ``ATEN_CPU_CAPABILITY=avx2``, whose fingerprint is pinned here: the model's bytes depend on the
    capability (torch's normal_ fill is vectorized under avx2 only; docs/demo.md, "What is reproducible
    across machines"), the key scheme under test does not, so the test holds on every x86-64 CPU."""
    from cropi.models import build_tiny_model

    import cropi.pipeline.score as score
    from cropi.pipeline.curriculum import CurriculumPaths, collect_jobs, gradient_jobs, scoring_splits

    monkeypatch.setattr(score, "model_fingerprint", lambda path: "98ee53bb8a66fe96")

    # "method" named: the default selector is diverse since issue 27, and a config that names no method
    # now means it (a curriculum started before under the old default resumes by naming cropi)
    cfg = CurriculumConfig.model_validate(dict(
        name="pinned", model="/m", pool="/p", validation={"v": "/v"}, stages=2, select_fraction=0.2, method="cropi",
        reward="exact_numeric", collect=dict(pool_samples=4, temperature=1.0, backend="hf",
                                             backend_options={"max_batch_rows": 8}),
        projection=dict(kind="sjlt", dim=64, kept_fraction=0.1), gradient_dtype="float32"))
    assert cfg.resume_key() == "33b13f976f82e4b9"
    # a curriculum with the check off, started before ``check.confirm_on`` existed (computed at 7d54023):
    # the demo's unchecked methods resume under issue 32's revision 3
    off = cfg.model_copy(update={"check": CheckOptions(enabled=False, samples=8)})
    assert off.resume_key() == "d5ca290d348b234d"
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, confirm_on="check_prompts")}
                          ).resume_key() != "d5ca290d348b234d"  # a choice other than the default is part of the key
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, at_whole_pool="keep")}
                          ).resume_key() != "d5ca290d348b234d"  # so is revision 5's rule (check.at_whole_pool)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, saturation_reference="stage_start")}
                          ).resume_key() != "d5ca290d348b234d"  # and the exploratory saturation reference
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, widen_check="race")}
                          ).resume_key() != "d5ca290d348b234d"  # and the raced widening (revision 13's candidate)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, screen="alpha")}
                          ).resume_key() != "d5ca290d348b234d"  # and the screen at alpha (revision 14's candidate)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_length="half")}
                          ).resume_key() != "d5ca290d348b234d"  # and the half-length race (round 15's candidate)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_length="part")}
                          ).resume_key() != "d5ca290d348b234d"  # and revision 16's whole-part race, since round 19
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_unresolved="fallback")}
                          ).resume_key() != "d5ca290d348b234d"  # and the fallback where a race cannot tell (round 20's)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_sample="check")}
                          ).resume_key() != "d5ca290d348b234d"  # and revision 19's race on the check's sample, since
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_sample="rest")}  # round 22
                          ).resume_key() == "d5ca290d348b234d"  # the default, unnamed in the key
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_no_gain="keep")}
                          ).resume_key() != "d5ca290d348b234d"  # and revision 22's race, since round 23
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_no_gain="pool")}
                          ).resume_key() == "2a49b5cf6004b5f3"  # and revision 23's, named as before it was the default
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_no_gain="restart")}
                          ).resume_key() == "d5ca290d348b234d"  # the default since round 24, unnamed in the key
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_no_gain="higher")}
                          ).resume_key() != "d5ca290d348b234d"  # and round 28's candidate
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_futility="never")}
                          ).resume_key() != "d5ca290d348b234d"  # and revisions 19-26's first look, since round 29
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_futility="stop")}
                          ).resume_key() == "d5ca290d348b234d"  # the default since round 29, unnamed in the key
    assert "0efb5c928af15036" in off.resume_keys()  # round 29's candidate, named before it was the default (800dbd0)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_gain_length="half")}
                          ).resume_key() == "d5ca290d348b234d"  # revisions 19-27's gain look, unnamed in the key
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_gain_length="sequential")}
                          ).resume_key() != "d5ca290d348b234d"  # and round 30's candidate
    assert "f6afeed0ea3b8926" in off.resume_keys()  # round 24's candidate, named before it was the default (50459a6)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_gain="any")}
                          ).resume_key() != "d5ca290d348b234d"  # and revisions 23-24's gain, since round 25
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, race_gain="resolved")}
                          ).resume_key() == "d5ca290d348b234d"  # the default since round 25, unnamed in the key
    assert "8e6a4fab0a0608ab" in off.resume_keys()  # round 25's candidate, named before it was the default (2d973e6)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, pool_revisit="never")}
                          ).resume_key() == "d5ca290d348b234d"  # revision 25's pool, unnamed in the key
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, pool_revisit="race")}
                          ).resume_key() != "d5ca290d348b234d"  # and the revisit (round 26's candidate)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, no_gain_draw="pool")}
                          ).resume_key() != "d5ca290d348b234d"  # and revisions 23-25's no-gain draw, since round 27
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, no_gain_draw="mixed")}
                          ).resume_key() == "d5ca290d348b234d"  # the default since round 27, unnamed in the key
    assert "ae75b2d0d337745b" in off.resume_keys()  # round 27's candidate, named before it was the default (d412228)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, widen_when="saturated")}
                          ).resume_key() != "d5ca290d348b234d"  # and revision 12's widening, since round 16 not the default
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, best_of="stage")}
                          ).resume_key() != "d5ca290d348b234d"  # and the best of the stage alone (before revision 6)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, test="normal")}
                          ).resume_key() != "d5ca290d348b234d"  # and the normal margin (before revision 7)
    assert off.model_copy(update={"check": CheckOptions(enabled=False, samples=8, rerace="never")}
                          ).resume_key() != "d5ca290d348b234d"  # and no race after a reversal (before revision 8)
    here = Path(__file__).resolve().parent
    cfg = CurriculumConfig.model_validate(dict(
        name="pinned", model=str(build_tiny_model(tmp_path / "m", seed=0)),
        pool=str(here / "golden" / "pool.jsonl"), validation={"val_a": str(here / "golden" / "val_a.jsonl")},
        reward="exact_numeric", collect=dict(pool_samples=4, temperature=1.0, backend="hf"), gradient_dtype="float32"))
    paths = CurriculumPaths("/root", "pinned")
    jobs = collect_jobs(cfg, paths, cfg.model, scoring_splits(cfg))
    assert {s: j.out for s, j in jobs.items()} == {"pool": "/root/trajectories/e1c45a7e15478640/pool",
                                                   "val_a": "/root/trajectories/82eebe8b77d116b4/val_a"}
    assert gradient_jobs(cfg, paths, cfg.model, {s: j.out for s, j in jobs.items()})[0].name == \
        "98ee53bb8a66fe96-7b16d27b"


def test_every_stage_records_its_selection_mix_against_the_pool(setup, cropi_run):
    from collections import Counter

    from cropi.data import load_prompts
    from cropi.pipeline.rank import load_ranking

    result, _, _ = cropi_run
    pool = {r.prompt_id: r for r in load_prompts(setup["files"]["pool"])}
    for stage in result["stages"]:
        subset = [r.prompt_id for r in load_prompts(stage["subset"])]
        mix = stage["selection"]
        assert mix["n"] == len(subset) == stage["n_prompts"] and mix["pool_n"] == len(pool)
        counts = Counter(pool[p].data_source for p in subset)  # hand count from the subset file
        for source, row in mix["sources"].items():
            assert row["selected"] == counts.get(source, 0)
    ranking = load_ranking(str(Path(setup["root"]) / "store"), result["stages"][0]["ranking"].split("/rankings/")[1]
                           .split("/")[0])
    assert ranking.meta["selection"]["n"] == result["stages"][0]["n_prompts"]


def test_a_stage_record_checks_the_skew_of_declared_fields(setup, monkeypatch):
    from collections import Counter

    use_trainer(monkeypatch, FakeTrainer())
    result = run_curriculum(make_config(setup, name="skew", method="random", stages=1, skew_fields=["level"]),
                            root=setup["root"])
    stage = result["stages"][0]
    pool = {r.prompt_id: r for r in load_prompts(setup["files"]["pool"])}
    picked = Counter(str(pool[r.prompt_id].extra_info.get("level")) for r in load_prompts(stage["subset"]))
    value, count = picked.most_common(1)[0]
    row = stage["selection"]["fields"]["level"]
    share = sum(str(r.extra_info.get("level")) == row["value"] for r in pool.values()) / len(pool)
    assert row["selected_share"] == pytest.approx(count / sum(picked.values())) and picked[row["value"]] == count
    assert row["pool_share"] == pytest.approx(share)
    assert stage["passes"] is None  # the fake trainer names no batch size


def test_a_second_selector_at_the_same_checkpoint_keeps_cropis_ranking(setup, cropi_run, monkeypatch):
    """A 'diverse' curriculum shares the initial model's gradients with CROPI's, stores its own ranking
    beside CROPI's (never over it), records its selector, and trains on exactly its selection."""
    result, _, _ = cropi_run
    cropi_ranking = result["stages"][0]["ranking"]
    before = pq.read_table(cropi_ranking)
    use_trainer(monkeypatch, FakeTrainer())
    diverse = run_curriculum(make_config(setup, name="diverse-run", method="diverse", stages=1), root=setup["root"])
    stage = diverse["stages"][0]
    assert stage["ranking"] == cropi_ranking.replace("/pool.cropi.parquet", "/pool.diverse.parquet")  # its own name
    assert pq.read_table(cropi_ranking).equals(before)  # CROPI's selected column untouched
    ranking = pq.read_table(stage["ranking"])
    meta = json.loads(ranking.schema.metadata[b"cropi.ranking"])
    assert meta["selector"] == "diverse" and meta["selector_options"] == {}
    assert meta["selection"]["random_alignment"] is not None
    chosen = [r.prompt_id for r in load_prompts(stage["subset"])]
    assert sorted(ranking.filter(ranking["selected"])["prompt_id"].to_pylist()) == sorted(chosen)
    rows = {r["prompt_id"]: r for r in ranking.to_pylist()}
    gain = {p: (r["score:val_a"] + r["score:val_b"]) / 2 for p, r in rows.items() if r["status"] == "ok"}
    positive = [p for p, g in gain.items() if g > 0]
    assert set(chosen) <= set(positive)  # first-order helpful prompts only
    assert len(chosen) == min(len(positive), math.ceil(FRACTION * POOL))
    record = stage["selection"]  # the stage record carries the picks' agreement from the ranking
    assert record["selection_alignment"] == meta["selection"]["selection_alignment"]
    assert "batch_signal_to_noise" not in record  # the fake trainer names no batch size: no verdict


def test_a_stage_record_warns_of_a_concentrated_selection_at_the_trainers_batch(setup, cropi_run, monkeypatch):
    from cropi.scoring.diagnostics import CONCENTRATED

    use_trainer(monkeypatch, FakeTrainer())
    config = make_config(setup, name="snr", stages=1, trainer_options={"batch_prompts": 1000})
    stage = run_curriculum(config, root=setup["root"])["stages"][0]
    sel = stage["selection"]["selection_alignment"]
    assert stage["selection"]["batch_signal_to_noise"] == pytest.approx(1000 * sel / (1 - sel))
    assert (CONCENTRATED in [w["code"] for w in stage["selection"]["warnings"]]) == (1000 * sel / (1 - sel) >= 1)


def test_the_service_finds_a_ranking_stored_under_its_selectors_name(setup, cropi_run):
    """CROPI's curriculum (selector 'cropi') stores its rankings as pool.cropi.parquet:
    the service's library finds and serves them, and their version follows the file."""
    from cropi.pipeline.rank import stored_ranking_name
    from cropi_service.domain.library import CropiLibrary

    result, _, _ = cropi_run
    path = Path(result["stages"][1]["ranking"])
    name, spec = path.parts[-3], path.parts[-2]
    assert path.name == "pool.cropi.parquet"
    assert stored_ranking_name(str(Path(setup["root"]) / "store"), name, spec) == "pool.cropi"
    library = CropiLibrary(setup["root"])
    served = library.ranking(name, spec)
    assert served.meta["selector"] == "cropi" and served.table.equals(pq.read_table(path).replace_schema_metadata())
    assert library.ranking_version(name, spec) is not None
    assert stored_ranking_name(str(Path(setup["root"]) / "store"), "nobody", spec) == f"pool.{DEFAULT_SELECTOR}"  # none yet
