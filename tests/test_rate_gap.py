"""benchmarks/rate_gap.py and the pure parts of benchmarks/ranking_shelf_life.py, against hand-built reports and
by-hand sums."""

import json
import math

import numpy as np
import pytest

from support.benchmarks import load_benchmark

gap = load_benchmark("rate_gap")
shelf = load_benchmark("ranking_shelf_life")


def _report(lr: float, aucs: dict[str, list[float]]) -> dict:
    return {"settings": {"lr": lr}, "auc_by_method": {m: {"mean": float(np.mean(v)), "per_seed": {
        str(i): x for i, x in enumerate(v)}} for m, v in aucs.items()}}


def test_the_gap_change_and_its_welch_se_by_hand(tmp_path):
    # base: checked beats cropi on the mean, full beats informative: gaps per seed 0.30-0.20, 0.34-0.22, 0.32-0.24
    base = _report(3e-4, {"checked": [0.30, 0.34, 0.32], "cropi": [0.10, 0.50, 0.20], "full": [0.20, 0.22, 0.24],
                          "informative": [0.19, 0.20, 0.21]})
    # other: cropi is the better influence method, informative the better control
    other = _report(1e-4, {"checked": [0.20, 0.20, 0.20], "cropi": [0.30, 0.31, 0.35], "full": [0.10, 0.10, 0.10],
                           "informative": [0.25, 0.25, 0.28]})
    paths = []
    for name, doc in (("base", base), ("other", other)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(doc))
    out = gap.main(["--pair", f"t={paths[0]},{paths[1]}", "--out", str(tmp_path)])["tasks"]["t"]
    assert (out["base"]["influence"], out["base"]["control"]) == ("checked", "full")
    assert (out["other"]["influence"], out["other"]["control"]) == ("cropi", "informative")
    a, b = np.array([0.10, 0.12, 0.08]), np.array([0.05, 0.06, 0.07])
    assert out["gap_change"] == pytest.approx(b.mean() - a.mean(), abs=1e-12)
    se = math.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 3)
    assert out["se"] == pytest.approx(se, abs=1e-12) and out["beyond_one_se"] == (abs(b.mean() - a.mean()) > se)
    assert json.loads((tmp_path / "rate_gap.json").read_text())["summary"]["t"]["other_lr"] == 1e-4


def test_the_shelf_life_command_is_recorded_without_a_machines_paths():
    argv = ["--work", "lists=/tmp/x/lists", "--halves", "--scratch", "/tmp/s", "--out", "benchmarks/results/y"]
    said = shelf.command_line("benchmarks/ranking_shelf_life.py", argv)  # the project's recorder (cmdline.py)
    assert "/tmp" not in said and "lists=DIR/lists" in said and "--out benchmarks/results/y" in said


def test_the_shelf_life_agreement_is_the_curriculums_own_diagnostic():
    a = {f"p{i}": float(i) for i in range(20)}
    b = {f"p{i}": float(-i) for i in range(20)} | {"extra": 5.0}
    out = shelf.agreement(a, b, 5)
    assert out == {"prompts": 20, "spearman": pytest.approx(-1.0), "top_overlap": 0.0, "random_top_overlap": 0.25}
