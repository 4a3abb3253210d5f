"""benchmarks/half_batch_progress.py's summary: mean gains per batch, half over whole, and the arms' order, against
hand-built runs and by-hand sums."""

import pytest

from support.benchmarks import load_benchmark

hb = load_benchmark("half_batch_progress")


def _run(a16, a8, b16, b8):
    """Two arms' (gain_5, gain_10) at batch 16 and 8."""
    row = lambda g: {"gain_5": g[0], "gain_10": g[1]}  # noqa: E731
    return {"theta0": 0.3, "arms": {"cropi": {"16": row(a16), "8": row(a8)}, "diverse": {"16": row(b16), "8": row(b8)}}}


def test_the_summary_averages_arms_and_seeds_per_batch_and_reads_the_order_at_5_updates():
    runs = {"x/s0": _run((0.02, 0.04), (0.01, 0.01), (0.00, 0.02), (0.03, 0.03)),  # order flips: cropi ahead, then not
            "x/s1": _run((0.01, 0.03), (0.02, 0.02), (0.03, 0.05), (0.04, 0.04)),  # diverse ahead at both
            "y/s0": _run((0.05, 0.06), (0.04, 0.05), (0.01, 0.02), (0.00, 0.01))}  # cropi ahead at both
    s = hb.summarize(runs)
    assert s["x"]["gain_10"]["whole"] == pytest.approx((0.04 + 0.02 + 0.03 + 0.05) / 4)
    assert s["x"]["gain_10"]["half"] == pytest.approx((0.01 + 0.03 + 0.02 + 0.04) / 4)
    assert s["x"]["gain_10"]["half_over_whole"] == pytest.approx(0.025 / 0.035, abs=1e-3)
    assert s["x"]["order_agrees"] == "1 of 2" and s["y"]["order_agrees"] == "1 of 1"
    assert s["all"]["order_agrees"] == "2 of 3"
    assert s["all"]["gain_5"]["whole"] == pytest.approx((0.02 + 0.00 + 0.01 + 0.03 + 0.05 + 0.01) / 6, abs=1e-4)
