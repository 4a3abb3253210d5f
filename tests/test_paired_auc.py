"""benchmarks/paired_auc.py: round 8's no-harm rule (docs/demo.md), against the formula worked by hand."""

from __future__ import annotations

import math

import pytest

from support.benchmarks import load_benchmark

paired_auc = load_benchmark("paired_auc")


def _report(per_seed: dict[str, float]) -> dict:
    return {"auc_by_method": {"checked": {"per_seed": per_seed, "mean": sum(per_seed.values()) / len(per_seed)}}}


def test_d_and_its_se_are_the_hand_computed_ones_and_the_bar_is_two_se():
    new = {"a": _report({"0": 0.50, "1": 0.40, "2": 0.60}), "b": _report({"0": 0.30, "1": 0.30, "2": 0.30})}
    old = {"a": _report({"0": 0.52, "1": 0.45, "2": 0.50}), "b": _report({"0": 0.30, "1": 0.30, "2": 0.30})}
    out = paired_auc.paired(new, old)
    d = [-0.02, -0.05, 0.10]  # task a's per-seed differences; task b changed nothing
    mean = sum(d) / 3
    var = sum((x - mean) ** 2 for x in d) / 2  # unbiased: n - 1
    assert out["tasks"]["a"]["differences"] == pytest.approx(d)
    assert out["D"] == pytest.approx(mean / 2)  # the mean over the 2 tasks of each task's mean
    assert out["SE"] == pytest.approx(math.sqrt(var / 3 + 0.0) / 2)
    assert out["passes"]
    worse = {"a": _report({"0": 0.40, "1": 0.35, "2": 0.41}), "b": new["b"]}
    assert not paired_auc.paired(worse, old)["passes"]  # a fall on every seed, beyond its spread
    assert paired_auc.paired(old, old) | {"tasks": None} == {"method": "checked", "tasks": None, "D": 0.0, "SE": 0.0,
                                                            "bar": -0.0, "passes": True, "rule": out["rule"]}


def test_seeds_must_pair():
    with pytest.raises(SystemExit, match="different seeds"):
        paired_auc.paired({"a": _report({"0": 0.5, "1": 0.5})}, {"a": _report({"0": 0.5, "2": 0.5})})
