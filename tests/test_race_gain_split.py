"""benchmarks/race_gain_split.py: a race's gain is the start's lead negated, resolved only beyond its critical value
times its SE; a task is broad only where a draw without a ranking beat both ranked rules; counts by hand."""

from support.benchmarks import load_benchmark

rg = load_benchmark("race_gain_split")


def _race(stage, start_lead, se, critical=1.7):
    return {"stage": stage, "start_over_winner": {"lead": start_lead, "se": se, "critical": critical}}


def test_gains_resolve_only_beyond_the_critical_value_and_tasks_split_by_what_won():
    races = {"runs": {"a/checked-seed0": [_race(0, -0.10, 0.05)],   # gain 0.10 > 1.7 x 0.05: resolved
                      "a/checked-seed1": [_race(0, -0.085, 0.05)],  # gain 0.085 = 1.7 x 0.05: not beyond it
                      "b/checked-seed0": [_race(0, 0.02, 0.01), _race(3, -0.5, 0.0)]}}  # a fall; se 0, a gain
    regret = {"tasks": {"a": {"auc": {"full": 0.30, "informative": 0.31, "cropi": 0.30, "diverse": 0.309}},
                        "b": {"auc": {"full": 0.30, "informative": 0.29, "cropi": 0.31, "diverse": 0.30}}}}
    out = rg.split(races, regret)
    a, b = out["tasks"]["a"], out["tasks"]["b"]
    assert a["side"] == "broad" and abs(a["broad_over_ranked"] - 0.001) < 1e-9
    assert b["side"] == "ranked"  # cropi's 0.31 beats full's 0.30: a tie or less is not broad
    assert [r["resolved"] for r in a["races"]] == [True, False]
    assert [(r["stage"], r["gain"], r["resolved"]) for r in b["races"]] == [(0, -0.02, False), (3, 0.5, True)]
    assert out["summary"] == {"broad": {"tasks": 1, "races": 2, "unresolved": 1},
                              "ranked": {"tasks": 1, "races": 2, "unresolved": 1}}
