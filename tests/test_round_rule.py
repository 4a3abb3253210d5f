"""benchmarks/round_rule.py: a check round's adoption rule (docs/demo.md, rounds 26-28), against readings worked by
hand: a task's harm needs both bounds, counts only where the candidate bound, and D's sign alone decides condition 2."""

from __future__ import annotations

import math

import pytest

from support.benchmarks import load_benchmark

round_rule, paired_auc = load_benchmark("round_rule"), load_benchmark("paired_auc")


def _report(per_seed: dict[str, float]) -> dict:
    return {"auc_by_method": {"checked": {"per_seed": per_seed}}}


def _reading(new: dict[str, list[float]], old: dict[str, list[float]], bound: dict[str, list[bool]],
             different: list | None = None):
    seeds = lambda xs: {str(i): x for i, x in enumerate(xs)}  # noqa: E731
    paired = paired_auc.paired({t: _report(seeds(v)) for t, v in new.items()},
                               {t: _report(seeds(v)) for t, v in old.items()})
    binding = {"tasks": {t: {str(i): {"bound": {"0": True} if b else None} for i, b in enumerate(bs)}
                         for t, bs in bound.items()},
               "not_bound_but_different": different or []}
    return paired, binding


def test_harm_needs_both_bounds_and_counts_only_where_the_candidate_bound():
    # a: bound, -0.03 on every seed but one, SE small -> harm; b: bound, -0.03 mean with a wide spread -> inside its
    # noise; c: not bound, -0.05 (a run that differs unbound is condition 1's, not 3's)
    new = {"a": [0.47, 0.47, 0.46], "b": [0.40, 0.50, 0.41], "c": [0.45, 0.45, 0.45]}
    old = {"a": [0.50, 0.50, 0.50], "b": [0.50, 0.40, 0.50], "c": [0.50, 0.50, 0.50]}
    paired, binding = _reading(new, old, {"a": [True, True, True], "b": [True, True, True], "c": [False] * 3})
    out = round_rule.rule(paired, binding)
    d_a = [-0.03, -0.03, -0.04]
    m_a = sum(d_a) / 3
    se_a = math.sqrt(sum((x - m_a) ** 2 for x in d_a) / 2 / 3)  # the seeds' unbiased variance over n
    assert out["tasks"]["a"]["se"] == pytest.approx(se_a) and out["tasks"]["a"]["harm"]
    d_b = [-0.10, 0.10, -0.09]
    m_b = sum(d_b) / 3
    assert out["tasks"]["b"]["mean"] == pytest.approx(m_b) and m_b < -0.02 and not out["tasks"]["b"]["harm"]
    assert not out["tasks"]["c"]["bound"] and not out["tasks"]["c"]["harm"]
    assert not out["no_harm"] and not out["adopted"]
    assert round_rule.rule(paired, binding, harm=0.04)["no_harm"]  # a's -0.033 is inside a bound of 0.04


def test_d_decides_by_its_sign_and_a_changed_unbound_run_blocks_adoption():
    zero = _reading({"a": [0.5, 0.6]}, {"a": [0.5, 0.6]}, {"a": [False, False]})
    assert round_rule.rule(*zero)["D"] == 0 and round_rule.rule(*zero)["adopted"]  # D = 0 passes condition 2
    below = _reading({"a": [0.49, 0.6]}, {"a": [0.5, 0.6]}, {"a": [True, False]})
    out = round_rule.rule(*below)
    assert out["D"] < 0 and not out["D_nonnegative"] and out["no_harm"] and not out["adopted"]
    changed = _reading({"a": [0.51, 0.6]}, {"a": [0.5, 0.6]}, {"a": [False, False]}, different=[["a", "0"]])
    out = round_rule.rule(*changed)
    assert out["D_nonnegative"] and not out["unbound_equal"] and not out["adopted"]


def test_a_task_the_round_did_not_run_counts_as_zero_and_must_be_the_record_itself():
    # round 29 reads D over every task of the record; binding.json holds only the tasks it ran (a, bound +0.02)
    ran = _reading({"a": [0.52, 0.52], "b": [0.3, 0.4]}, {"a": [0.50, 0.50], "b": [0.3, 0.4]}, {"a": [True, True]})
    out = round_rule.rule(*ran)
    assert out["D"] == pytest.approx(0.01) and out["tasks_run"] == ["a"] and out["tasks_not_run"] == ["b"]
    assert out["tasks"]["b"] == {"run": False, "bound": False, "mean": 0.0, "se": 0.0, "harm": False}
    assert out["unbound_equal"] and out["adopted"]
    changed = _reading({"a": [0.52, 0.52], "b": [0.31, 0.4]}, {"a": [0.50, 0.50], "b": [0.3, 0.4]},
                       {"a": [True, True]})
    out = round_rule.rule(*changed)  # a task not run whose pair differs: not the record, so (1) fails
    assert out["changed_but_not_run"] == ["b"] and not out["unbound_equal"] and not out["adopted"]
