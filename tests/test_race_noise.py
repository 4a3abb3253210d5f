"""benchmarks/race_noise.py: each race's paired lead and its verdict read from a run's records, the arms' unchecked
AUCs beside it, and the summary over resolved and unresolved races, against hand-built runs and by-hand sums."""

import json
import math
from pathlib import Path

from support.benchmarks import load_benchmark

noise = load_benchmark("race_noise")


def _stage(won: dict, lost: dict, arms=("cropi", "diverse")) -> dict:
    return {"check": {"plan": {"arms": list(arms), "test": "t"},
                      "race": [{"arm": lost["arm"], "race": "lost", "values": lost["values"]},
                               {"arm": won["arm"], "race": "won", "values": won["values"]}]}}


def _write_run(root: Path, seed: int, stages: list[dict]) -> None:
    folder = root / f"checked-seed{seed}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"stages": stages}))


def test_leads_verdicts_and_the_summary(tmp_path):
    runs = tmp_path / "curricula"
    # seed 0: diverse leads by 0.5 on every prompt of one set (SE 0: resolved); stage 1 unraced
    _write_run(runs, 0, [_stage({"arm": "diverse", "values": {"v": [0.5, 1.0, 0.75]}},
                                {"arm": "cropi", "values": {"v": [0.0, 0.5, 0.25]}}), {"check": {}}])
    # seed 1: cropi leads by 0.05 on average over differences (+0.25, -0.25, +0.25, -0.05): unresolved
    _write_run(runs, 1, [_stage({"arm": "cropi", "values": {"v": [0.5, 0.25, 0.75, 0.45]}},
                                {"arm": "diverse", "values": {"v": [0.25, 0.5, 0.5, 0.5]}})])
    curves = {"cropi": {"0": [0.1, 0.2, 0.3], "1": [0.1, 0.4, 0.5]}, "diverse": {"0": [0.1, 0.3, 0.5], "1": [0.1, 0.2, 0.2]}}
    report = {"accuracy_by_step": {m: {s: {str(10 * i): {"sampled": v} for i, v in enumerate(c)} for s, c in seeds.items()}
                                   for m, seeds in curves.items()}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = noise.main(["--runs", f"t={runs}", "--report", f"t={path}", "--out", str(tmp_path)])
    (r0,), (r1,) = out["tasks"]["t"]["0"], out["tasks"]["t"]["1"]
    assert r0["won"] == "diverse" and abs(r0["lead"] - 0.5) < 1e-9 and r0["se"] == 0 and r0["resolved"] is True
    d = [0.25, -0.25, 0.25, -0.05]
    mean = sum(d) / 4
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 3 / 4)
    assert abs(r1["lead"] - mean) < 1e-6 and abs(r1["se"] - se) < 1e-6 and r1["resolved"] is False
    # unchecked AUCs by trapezoids over steps 0, 10, 20
    auc = lambda ys: (10 * (ys[0] + ys[1]) / 2 + 10 * (ys[1] + ys[2]) / 2) / 20  # noqa: E731
    assert abs(r0["unchecked_auc"]["won"] - round(auc([0.1, 0.3, 0.5]), 4)) < 1e-9
    assert abs(r1["unchecked_auc"]["lost"] - round(auc([0.1, 0.2, 0.2]), 4)) < 1e-9
    s = out["stage0"]
    assert s["resolved"]["n"] == 1 and s["resolved"]["loser_higher"] == 0
    gap = round(auc([0.1, 0.3, 0.5]) - auc([0.1, 0.2, 0.3]), 4)
    assert abs(s["resolved"]["mean_auc_winner_minus_loser"] - gap) < 1e-4
    assert abs(s["resolved"]["mean_auc_primary_minus_other"] + gap) < 1e-4  # the primary (cropi) lost it
    assert abs(s["resolved"]["mean_auc_primary_minus_winner"] + gap) < 1e-4  # the winner was diverse
    assert s["unresolved"]["n"] == 1 and s["unresolved"]["mean_auc_primary_minus_other"] > 0
    assert s["unresolved"]["mean_auc_primary_minus_winner"] == 0  # the primary won it
    assert s["resolved"]["mean_auc_fallback_minus_winner"] == 0  # the fallback (diverse) won it
    unres = round(auc([0.1, 0.2, 0.2]) - auc([0.1, 0.4, 0.5]), 4)  # diverse's run less the winner's (cropi)
    assert abs(s["unresolved"]["mean_auc_fallback_minus_winner"] - unres) < 1e-4
    assert json.loads((tmp_path / "race_noise.json").read_text())["stage0"] == s
