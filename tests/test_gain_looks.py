"""benchmarks/gain_looks.py: a round 30 run's gain looks and a round 31 run's first looks read from demo reports,
against values worked by hand; a stage where the rule did not act (``on`` or ``gained`` false, or no look) is not a
row."""

from __future__ import annotations

import json

import pytest

from support.benchmarks import load_benchmark

gain_looks = load_benchmark("gain_looks")


def _gain(lead: float, se: float, resolved: bool) -> dict:
    return {"lead": lead, "se": se, "resolved": resolved}


def _written(tmp_path, new: dict, old: dict):
    paths = tmp_path / "new.json", tmp_path / "old.json"
    for path, doc in zip(paths, (new, old)):
        path.write_text(json.dumps(doc))
    return paths


def _reports(tmp_path):
    new = {"auc_by_method": {"cand": {"per_seed": {"0": 0.40, "1": 0.30, "2": 0.50}}},
           "checks": {"cand": {
               "0": {"0": {"race_gain_look": {"on": True, "gain": _gain(0.01, 0.02, False)},
                           "race_start": {"gain": _gain(0.05, 0.02, True)}, "race_on": [{"arm": "diverse"}]}},
               "1": {"0": {"race_gain_look": {"on": True, "gain": _gain(0.03, 0.02, False)},
                           "race_start": {"gain": _gain(-0.01, 0.02, False)}, "race_on": [{"arm": "cropi"}]},
                     "2": {"race_gain_look": {"on": False, "gain": _gain(-0.01, 0.02, False)}}},
               "2": {"0": {}}}}}
    old = {"auc_by_method": {"checked": {"per_seed": {"0": 0.38, "1": 0.33, "2": 0.50}}}}
    return _written(tmp_path, new, old)


def test_each_run_where_the_winner_trained_on_is_read_in_its_ses_and_summed_up(tmp_path):
    new, old = _reports(tmp_path)
    out = gain_looks.main(["--task", f"t={new}:{old}", "--new", "cand", "--old", "checked", "--out", str(tmp_path)])
    rows = out["tasks"]["t"]
    assert [(r["seed"], r["stage"], r["winner"], r["whole_resolved"]) for r in rows] == [
        ("0", 0, "diverse", True), ("1", 0, "cropi", False)]
    assert [r["half_over_se"] for r in rows] == [0.5, 1.5] and [r["whole_over_se"] for r in rows] == [2.5, -0.5]
    assert [r["auc_change"] for r in rows] == pytest.approx([0.02, -0.03])
    s = out["summary"]
    assert (s["runs"], s["whole_resolved"]) == (2, 1)
    assert (s["mean_half_over_se"], s["mean_whole_over_se"]) == (1.0, 1.0)
    assert s["mean_auc_change"] == pytest.approx(-0.005)
    assert json.loads((tmp_path / "gain_looks.json").read_text())["summary"] == s


def _first_look_reports(tmp_path):
    def stage(gained, gain, lead, won):
        race = [{"arm": a, "race": "won" if a == won else "lost"} for a in ("cropi", "diverse")]
        return {"race_first_look": {"lead": lead, "se": 0.02, "resolved": False, "gained": gained,
                                    "gain": _gain(gain, 0.02, gained) | {"critical": 1.66}}, "race": race}

    new = {"auc_by_method": {"cand": {"per_seed": {"0": 0.40, "1": 0.30, "2": 0.50}}},
           "checks": {"cand": {"0": {"0": stage(True, 0.04, 0.02, "diverse")},
                               "1": {"0": stage(True, 0.05, -0.01, "cropi"), "2": stage(False, 0.01, 0.0, "cropi")},
                               "2": {"0": {}}}}}
    whole = lambda won: {"race_on": [{"arm": a, "race": "won" if a == won else "lost"}  # noqa: E731
                                     for a in ("cropi", "diverse")]}
    old = {"auc_by_method": {"checked": {"per_seed": {"0": 0.38, "1": 0.33, "2": 0.50}}},
           "checks": {"checked": {"0": {"0": whole("diverse")}, "1": {"0": whole("diverse")}, "2": {}}}}
    return _written(tmp_path, new, old)


def test_each_first_look_that_stopped_for_its_gain_is_read_against_the_old_whole_parts_pick(tmp_path):
    new, old = _first_look_reports(tmp_path)
    out = gain_looks.main(["--task", f"t={new}:{old}", "--new", "cand", "--old", "checked", "--look", "first",
                           "--out", str(tmp_path)])
    rows = out["tasks"]["t"]
    assert [(r["seed"], r["went_on"], r["old_went_on"], r["changed"]) for r in rows] == [
        ("0", "diverse", "diverse", False), ("1", "cropi", "diverse", True)]
    assert [r["gain_over_se"] for r in rows] == [2.0, 2.5] and [r["lead_over_se"] for r in rows] == [1.0, -0.5]
    s = out["summary"]
    assert (s["runs"], s["changed"], s["mean_gain_over_se"]) == (2, 1, 2.25)
    assert s["mean_auc_change"] == pytest.approx(-0.005) and s["mean_auc_change_changed"] == pytest.approx(-0.03)
    assert json.loads((tmp_path / "first_looks.json").read_text())["summary"] == s
