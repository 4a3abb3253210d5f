"""benchmarks/revisit_outcomes.py: a revisit ends by whose lead was resolved, or neither's; a race's loser's steps
count both its halves and never the winner's; counts by hand."""

from support.benchmarks import load_benchmark

ro = load_benchmark("revisit_outcomes")


def _stage(higher, resolved, went_on, lost=(1, 1), won=(1, 1)):
    race = [{"race": "lost", "steps": lost[0]}, {"race": "won", "steps": won[0]}]
    race_on = [{"race": "lost", "steps": lost[1]}, {"race": "won", "steps": won[1]}] if lost[1] else []
    return {"revisit": {"higher": higher, "went_on": went_on, "lead": {"lead": 0.02, "se": 0.01, "resolved": resolved}},
            "race": race, "race_on": race_on}


def test_a_revisit_ends_by_whose_lead_resolved_and_its_loser_spends_both_halves():
    report = {"checks": {"checked_revisit": {
        "0": {"0": {"race": []}, "1": _stage("ranked", False, "pool", lost=(2, 3), won=(5, 7)),
              "2": _stage("pool", True, "pool", lost=(2, 0), won=(9, 0))},
        "1": {"1": _stage("ranked", True, "ranked")},
        "2": {"0": {"race": [{"race": "lost", "steps": 4}]}}}}}  # a stage-0 race: no revisit, not counted
    out = ro.outcomes([("t", report)], "checked_revisit")
    rows = out["tasks"]["t"]["runs"]
    assert sorted(rows) == ["0", "1"]
    assert [(r["stage"], r["end"], r["lost_steps"]) for r in rows["0"]] == [(1, "neither", 5), (2, "pool_resolved", 2)]
    assert [(r["end"], r["went_on"]) for r in rows["1"]] == [("ranked_resolved", "ranked")]
    assert out["summary"] == {"ranked_resolved": 1, "pool_resolved": 1, "neither": 1, "revisits": 3, "runs": 2,
                              "lost_steps": 9, "went_on_ranked": 1}
