"""benchmarks/early_readings.py: the count docs/demo.md quotes (seeds on which the pool reads above the better
of the checked run's two arms), against a hand-built report."""

import json

from support.benchmarks import load_benchmark

early = load_benchmark("early_readings")


def _report(values: dict) -> dict:
    """method -> seed -> step -> sampled accuracy, in the report's shape."""
    return {"accuracy_by_step": {m: {s: {str(step): {"sampled": v} for step, v in steps.items()}
                                     for s, steps in seeds.items()} for m, seeds in values.items()}}


def test_the_pool_leads_only_where_it_reads_above_both_arms(tmp_path):
    # seed 0: the pool beats cropi but not diverse (no lead); seed 1: above both; seed 2: a tie with the better
    # arm is no lead (strictly above). Step 20 lacks diverse on one seed, so it is not read.
    report = _report({
        "full": {"0": {10: 0.5, 20: 0.6}, "1": {10: 0.5, 20: 0.6}, "2": {10: 0.4, 20: 0.6}},
        "cropi": {"0": {10: 0.4, 20: 0.1}, "1": {10: 0.4, 20: 0.1}, "2": {10: 0.4, 20: 0.1}},
        "diverse": {"0": {10: 0.6, 20: 0.1}, "1": {10: 0.3, 20: 0.1}, "2": {10: 0.1}},
    })
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = early.main(["--report", f"t={path}", "--out", str(tmp_path / "out.json")])
    at = out["tasks"]["t"]
    assert list(at) == ["10"]
    assert at["10"]["pool_leads"] == 1 and at["10"]["seeds"] == 3
    assert abs(at["10"]["full"] - (0.5 + 0.5 + 0.4) / 3) < 1e-4 and abs(at["10"]["diverse"] - 1.0 / 3) < 1e-4
    assert json.loads((tmp_path / "out.json").read_text()) == out
