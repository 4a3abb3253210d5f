"""benchmarks/race_arms.py: the arm a race of unchecked runs picks and the AUC after its spent parts, against a
hand-built report and a brute-force area."""

import json

from support.benchmarks import load_benchmark

arms = load_benchmark("race_arms")


def _report(values: dict) -> dict:
    """method -> seed -> [accuracy at steps 0, 10, 20, 30, 40]."""
    return {"accuracy_by_step": {m: {s: {str(10 * i): {"sampled": v} for i, v in enumerate(curve)}
                                     for s, curve in seeds.items()} for m, seeds in values.items()},
            "auc_by_method": {m: {"mean": 0.0} for m in values}}


def _brute_area(ys: list[float]) -> float:
    """Trapezoids of width 10 over 40 steps, by hand."""
    return sum(10 * (a + b) / 2 for a, b in zip(ys, ys[1:])) / 40


def test_the_race_picks_the_higher_reading_at_its_step_and_pays_each_losers_part(tmp_path):
    report = _report({
        "cropi": {"0": [0.1, 0.5, 0.6, 0.7, 0.8], "1": [0.1, 0.3, 0.3, 0.3, 0.3]},
        "diverse": {"0": [0.1, 0.4, 0.9, 0.9, 0.9], "1": [0.1, 0.3, 0.9, 0.9, 0.9]},  # seed 1: a tie at step 10
        "informative": {"0": [0.1, 0.6, 0.6, 0.6, 0.6], "1": [0.1, 0.2, 0.2, 0.2, 0.2]},
    })
    two = arms.race(report, ("cropi", "diverse"))
    assert two["winners"] == {"0": "cropi", "1": "cropi"}  # the tie goes to the first (the primary)
    # one lost part: the winner's curve starts 10 steps late, theta_0's 0.1 held for them
    assert abs(two["auc_per_seed"]["0"] - _brute_area([0.1, 0.1, 0.5, 0.6, 0.7])) < 1e-4
    three = arms.race(report, ("cropi", "diverse", "informative"))
    assert three["winners"]["0"] == "informative"
    assert abs(three["auc_per_seed"]["0"] - _brute_area([0.1, 0.1, 0.1, 0.6, 0.6])) < 1e-4  # two lost parts
    assert arms.race(report, ("cropi", "full")) is None  # a report without the arm


def test_the_checked_races_lead_and_its_recorded_noise(tmp_path):
    """The lead is the winner's objective minus the loser's (on the race's own reading where it has one); its SE and verdict come from the stage's ``race_lead``
    where the report has one, and are absent (not the winner's part SE, which is not the lead's) where it has not."""
    report = _report({"cropi": {"0": [0.1] * 5, "1": [0.1] * 5}})
    race = [{"arm": "cropi", "objective": 0.30, "race": "lost"}, {"arm": "diverse", "objective": 0.36, "race": "won"}]
    noise = {"lead": 0.06, "se": 0.04, "df": 30.0, "critical": 1.6973, "alpha": 0.05, "resolved": False}
    read = [e | {"race_objective": e["objective"] + (0.1 if e["race"] == "won" else 0.0)} for e in race]
    report["checks"] = {"checked": {"0": {"0": {"race": race, "race_lead": noise, "parts": [{"se": 0.03}]}},
                                    "1": {"0": {"race": race, "parts": [{"se": 0.03}]}},
                                    "2": {"0": {"race": read, "parts": [{"se": 0.03}]}}}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    out = arms.main(["--report", f"t={path}", "--out", str(tmp_path)])
    races = out["tasks"]["t"]["checked_stage0_races"]
    assert races["0"]["won"] == "diverse" and abs(races["0"]["lead"] - 0.06) < 1e-9
    assert races["0"]["se"] == 0.04 and races["0"]["resolved"] is False
    assert "se" not in races["1"] and abs(races["1"]["lead"] - 0.06) < 1e-9
    assert abs(races["2"]["lead"] - 0.16) < 1e-9  # revision 22's race decided on its own reading
    assert json.loads((tmp_path / "race_arms.json").read_text()) == out
