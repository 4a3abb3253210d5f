"""benchmarks/zero_gradient_drift.py: the classes and shares docs/demo.md quotes, against hand-counted cases."""

import pytest

from support.benchmarks import load_benchmark

drift = load_benchmark("zero_gradient_drift")


@pytest.mark.parametrize("rewards,want", [
    ([1.0, 1.0, 1.0], "all_correct"), ([0.0, 0.0], "all_wrong"), ([1.0, 0.0, 1.0], "mixed"),
    ([1.0, None, 1.0], "all_correct"),  # a failed reward is not scored, so it does not make the group mixed
    ([0.0, None], "all_wrong"), ([None, None], "all_wrong"), ([0.999, 1.0], "mixed")])
def test_offline_class_is_the_zero_gradient_rule(rewards, want):
    assert drift.offline_class(rewards) == want


def test_summary_splits_the_pass_rates_by_offline_class():
    rates = {"a": 1.0, "b": 0.5, "c": 0.0, "d": 0.25}
    classes = {"a": "all_correct", "b": "all_correct", "c": "mixed", "d": "all_wrong"}
    out = drift.summary(rates, classes)
    assert out["all_correct"] == {"prompts": 2, "pass_rate": 0.75, "share_now_mixed": 0.5, "share_now_all_wrong": 0.0}
    assert out["mixed"] == {"prompts": 1, "pass_rate": 0.0, "share_now_mixed": 0.0, "share_now_all_wrong": 1.0}
    assert out["all_wrong"] == {"prompts": 1, "pass_rate": 0.25, "share_now_mixed": 1.0, "share_now_all_wrong": 0.0}


def test_summary_leaves_out_a_class_the_pool_lacks():
    assert set(drift.summary({"a": 1.0}, {"a": "all_correct"})) == {"all_correct"}
