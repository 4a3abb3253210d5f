"""benchmarks/merge_method.py: a round's report is the committed one with the round's method in place of the
default's, nested entries included, nothing stale kept, and only when full reran bit for bit."""

import json

import pytest

from support.benchmarks import load_benchmark

mm = load_benchmark("merge_method")


def _reports():
    committed = {"auc_by_method": {"checked": {"mean": 0.5}, "full": {"mean": 0.6}, "cropi": {"mean": 0.4}},
                 "acceleration_at_share": {"0.9": {"checked": {"mean": 0.5}, "cropi": {"mean": 0.3}}},
                 "versus_informative": {"checked": {"beats": True}},
                 "accuracy_by_step": {"full": {"0": {"10": 0.1}}, "checked": {"0": {"10": 0.2}}}, "task": "t"}
    new = {"auc_by_method": {"checked_refresh": {"mean": 0.55}, "full": {"mean": 0.6}},
           "acceleration_at_share": {"0.9": {"checked_refresh": {"mean": 0.9}}},
           "accuracy_by_step": {"full": {"0": {"10": 0.1}}, "checked_refresh": {"0": {"10": 0.3}}}, "task": "t"}
    return committed, new


def test_the_method_replaces_the_default_at_every_depth_and_nothing_stale_stays(tmp_path):
    committed, new = _reports()
    (tmp_path / "c.json").write_text(json.dumps(committed))
    (tmp_path / "n.json").write_text(json.dumps(new))
    out = mm.main(["--committed", str(tmp_path / "c.json"), "--new", str(tmp_path / "n.json"),
                   "--method", "checked_refresh", "--as", "checked", "--out", str(tmp_path / "m.json")])
    assert out["auc_by_method"] == {"checked": {"mean": 0.55}, "full": {"mean": 0.6}, "cropi": {"mean": 0.4}}
    assert out["acceleration_at_share"]["0.9"] == {"checked": {"mean": 0.9}, "cropi": {"mean": 0.3}}
    assert out["accuracy_by_step"]["checked"] == {"0": {"10": 0.3}}
    assert "checked" not in out["versus_informative"]  # the new report has no such entry: dropped, not kept
    assert json.loads((tmp_path / "m.json").read_text()) == out


def test_a_full_that_did_not_rerun_bit_for_bit_is_refused(tmp_path):
    committed, new = _reports()
    new["accuracy_by_step"]["full"]["0"]["10"] = 0.10001
    (tmp_path / "c.json").write_text(json.dumps(committed))
    (tmp_path / "n.json").write_text(json.dumps(new))
    with pytest.raises(SystemExit, match="bit for bit"):
        mm.main(["--committed", str(tmp_path / "c.json"), "--new", str(tmp_path / "n.json"),
                 "--method", "checked_refresh", "--as", "checked", "--out", str(tmp_path / "m.json")])


def test_across_machines_merges_and_records_both_fulls(tmp_path):
    """A new report from another machine (full cannot repeat bit for bit) merges only when said, and the merge
    records both fulls' AUC beside the method's entries."""
    committed, new = _reports()
    new["accuracy_by_step"]["full"]["0"]["10"] = 0.10001
    new["auc_by_method"]["full"] = {"mean": 0.61}
    (tmp_path / "c.json").write_text(json.dumps(committed))
    (tmp_path / "n.json").write_text(json.dumps(new))
    out = mm.main(["--committed", str(tmp_path / "c.json"), "--new", str(tmp_path / "n.json"), "--across-machines",
                   "--method", "checked_refresh", "--as", "checked", "--out", str(tmp_path / "m.json")])
    assert out["auc_by_method"]["checked"] == {"mean": 0.55} and out["auc_by_method"]["full"] == {"mean": 0.6}
    assert out["merged"]["full_auc"] == {"committed": {"mean": 0.6}, "new": {"mean": 0.61}}
