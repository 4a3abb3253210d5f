"""The demo: step acceleration, evaluation, warm-start, the shipped model, and `cropi demo --quick` end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cropi.demo import DemoSettings
from cropi.demo import evaluate as evaluate_module
from cropi.demo.acceleration import aggregate, first_step_reaching, step_acceleration
from cropi.errors import CropiError
from cropi.generation import Sample, render_prompt
from cropi.tasks.arithmetic import make_task_splits, solution_text

METHODS = ("cropi", "full", "random", "pass_rate")


# ---------------------------------------------------------------- step acceleration


def test_step_acceleration_on_a_worked_example():
    steps = [0, 4, 8, 12]
    r = step_acceleration(steps, full=[0.10, 0.20, 0.30, 0.30], cropi=[0.10, 0.30, 0.25, 0.40])
    assert r["target"] == 0.30 and r["full_steps"] == 8 and r["cropi_steps"] == 4 and r["value"] == 2.0


def test_step_acceleration_is_undefined_with_a_reason():
    flat = step_acceleration([0, 5, 10], full=[0.2, 0.1, 0.2], cropi=[0.2, 0.3, 0.4])
    assert flat["value"] is None and "never rose" in flat["reason"]
    slow = step_acceleration([0, 5, 10], full=[0.1, 0.2, 0.3], cropi=[0.1, 0.15, 0.2])
    assert slow["value"] is None and "never reached" in slow["reason"] and slow["cropi_steps"] is None
    with pytest.raises(CropiError):
        step_acceleration([0, 5], full=[0.1], cropi=[0.1, 0.2])


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 8).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 20), min_size=n, max_size=n), st.lists(st.integers(0, 20), min_size=n - 1, max_size=n - 1))))
def test_step_acceleration_against_brute_force(curves):
    """Same step-0 model for both runs; accuracies are k/20 on a 20-prompt test set."""
    full_k, cropi_tail = curves
    steps = [10 * i for i in range(len(full_k))]
    full = [k / 20 for k in full_k]
    cropi = [full[0]] + [k / 20 for k in cropi_tail]
    r = step_acceleration(steps, full, cropi)
    target = full[-1]
    full_steps = min(s for s, a in zip(steps, full) if a >= target)
    reached = [s for s, a in zip(steps, cropi) if a >= target]
    if full_steps == 0:
        assert r["value"] is None
    elif not reached:
        assert r["value"] is None and r["cropi_steps"] is None
    else:
        assert r["value"] == pytest.approx(full_steps / min(reached))
    assert first_step_reaching(steps, full, target) == full_steps


def test_aggregate_uses_defined_seeds_only():
    per_seed = {"0": {"value": 2.0, "reason": None}, "1": {"value": 4.0, "reason": None},
                "2": {"value": None, "reason": "never reached"}}
    a = aggregate(per_seed)
    assert a["mean"] == 3.0 and a["std"] == pytest.approx(math.sqrt(2)) and a["n"] == 2
    assert a["undefined"] == {"2": "never reached"}
    assert aggregate({"0": {"value": None, "reason": "x"}})["mean"] is None


# ---------------------------------------------------------------- evaluation


class ScriptedBackend:
    """Answers correctly the prompts whose id is in ``right``, wrongly the rest."""

    def __init__(self, records, right):
        self.by_prompt = {r.prompt_id: r for r in records}
        self.right = right

    def generate(self, prompts, keys, cfg):
        assert cfg.temperature == 0.0 and cfg.samples == 1  # greedy
        out = []
        for key in keys:
            r = self.by_prompt[key]
            text = solution_text(r) if key in self.right else "The answer is \\boxed{123456789}."
            out.append([Sample(token_ids=[1], logprobs=[0.0], text=text, finish_reason="stop")])
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_evaluate_counts_correct_answers_overall_and_by_skill(monkeypatch, tiny_model):
    records = make_task_splits(3, pool_size=30, val_size=2, test_size=2)["pool"]
    right = {r.prompt_id for i, r in enumerate(records) if i % 3 == 0}
    monkeypatch.setattr(evaluate_module, "make_backend", lambda name, path, **kw: ScriptedBackend(records, right))
    result = evaluate_module.evaluate(tiny_model, records, reward="exact_numeric")
    assert result["accuracy"] == pytest.approx(len(right) / len(records))
    for skill, acc in result["by_group"].items():
        mine = [r for r in records if r.extra_info["skill"] == skill]
        assert acc == pytest.approx(sum(r.prompt_id in right for r in mine) / len(mine))


# ---------------------------------------------------------------- warm-start and the shipped model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from cropi.models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", size="tiny", seed=0))


def test_warm_start_is_deterministic_and_learns(tmp_path):
    from safetensors.torch import load_file

    from cropi.models import load_tokenizer
    from cropi.demo.warmstart import WarmStartConfig, encode_example, warm_start

    records = make_task_splits(11, pool_size=48, val_size=2, test_size=2)["pool"]
    cfg = WarmStartConfig(steps=12, batch_size=8, lr=3e-3, warmup=2, seed=5)
    a = warm_start(tmp_path / "a", records, cfg)
    b = warm_start(tmp_path / "b", records, cfg)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["loss_last"] < a["loss_first"]
    tok = load_tokenizer(tmp_path / "a")
    ids, n_prompt = encode_example(tok, records[0])
    assert ids[:n_prompt] == render_prompt(tok, records[0].prompt)  # what generation samples from
    assert tok.decode(ids[n_prompt:], skip_special_tokens=True) == solution_text(records[0])


def test_shipped_model_is_warm_but_not_perfect():
    from cropi.demo.assets import RECIPE_FILE, shipped_model
    from cropi.models import load_causal_lm

    folder = shipped_model()
    doc = json.loads((folder / RECIPE_FILE).read_text())
    assert 0 < doc["test_accuracy"]["test"]["accuracy"] < 1
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size < 8 * 2**20  # a few MB
    load_causal_lm(folder)


def test_warmstart_records_avoid_every_demo_split():
    from cropi.demo.assets import demo_heldout_ids, warmstart_records

    ids = {r.prompt_id for r in warmstart_records(600)}
    assert ids and not ids & demo_heldout_ids()


def test_shipped_model_was_trained_apart_from_the_current_demo_splits():
    """The demo's split sizes decide which problems the warm-start set leaves out: after a change of
    DemoSettings the shipped model must be rebuilt (python -m cropi.demo.build_assets)."""
    from cropi.data import prompts_fingerprint
    from cropi.demo.assets import RECIPE_FILE, shipped_model, warmstart_records

    doc = json.loads((shipped_model() / RECIPE_FILE).read_text())
    assert doc["prompts_fingerprint"] == prompts_fingerprint(warmstart_records())


def test_bad_settings_are_refused():
    with pytest.raises(CropiError, match="seeds"):
        DemoSettings.make(quick=True, seeds=0)
    with pytest.raises(CropiError, match="methods"):
        DemoSettings.make(methods=("cropi", "nope"))


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    from cropi.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    quick = DemoSettings.quick()
    steps = [str(quick.steps_per_stage * m) for m in range(quick.stages + 1)]
    assert set(report["accuracy_by_step"]) == set(METHODS)
    for method in METHODS:
        seeds = report["accuracy_by_step"][method]
        assert sorted(seeds) == [str(s) for s in range(quick.seeds)]
        for acc in seeds.values():
            assert list(acc) == steps and all(0 <= a <= 1 for a in acc.values())
            assert acc["0"] == report["initial_model"]["test_accuracy"]  # every run starts at theta_0
    acc = report["step_acceleration"]
    assert sorted(acc["per_seed"]) == [str(s) for s in range(quick.seeds)]
    assert {"mean", "std", "n", "undefined", "definition"} <= set(acc)
    for r in acc["per_seed"].values():
        assert (r["value"] is None) == (r["reason"] is not None)
        if r["value"] is not None:
            assert r["value"] == pytest.approx(r["full_steps"] / r["cropi_steps"])
    for png in report["plots"]:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(report["plots"]) == 3 and (out / "report.md").is_file()
    mix = report["selection"]
    assert mix["full"]["0"]["n"] == report["task"]["pool"]
    assert mix["cropi"]["0"]["n"] <= math.ceil(quick.select_fraction * report["task"]["pool"])
