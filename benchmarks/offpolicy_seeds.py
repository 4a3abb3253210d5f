"""The off-policy benchmark over its seeds: the farthest checkpoint's figures per seed, and their mean.

    python benchmarks/offpolicy.py --out benchmarks/results [--seed S]     (one run per seed)
    python benchmarks/offpolicy_seeds.py                                    ->  benchmarks/results/offpolicy_seeds.json

Reads benchmarks/results/offpolicy.json (seed 0) and offpolicy_seed<S>.json.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def farthest(report: dict) -> dict:
    """The figures issue 18 asks for, at the farthest checkpoint of one run."""
    far = report["checkpoints"][-1]
    st = far["status_refresh"]
    return {"steps": far["steps"],
            "overlap_at_10": {"cropi": far["overlap_at_10"], "theta": far["variants"]["theta"]["overlap_at_10"],
                              "ess_refresh": far["overlap_at_10_refresh"],
                              "status_refresh_cropi": st["popi"]["overlap_at_10"],
                              "status_refresh_theta": st["theta"]["overlap_at_10"],
                              "random_refresh_theta": st["theta"]["random"]["overlap_at_10"]},
            "spearman": {"cropi": far["spearman"], "theta": far["variants"]["theta"]["spearman"],
                         "status_refresh_theta": st["theta"]["spearman"],
                         "random_refresh_theta": st["theta"]["random"]["spearman"]},
            "status_refresh_fraction": st["refresh_fraction"],
            "gain_per_refreshed_prompt_theta": {"status": st["theta"]["overlap_gain_per_refreshed_prompt"],
                                                "random": st["theta"]["random"]["overlap_gain_per_refreshed_prompt"]}}


def main() -> int:
    runs = {0: RESULTS / "offpolicy.json"} | {int(m.group(1)): p for p in RESULTS.glob("offpolicy_seed*.json")
                                             if (m := re.fullmatch(r"offpolicy_seed(\d+)\.json", p.name))}
    per_seed = {s: farthest(json.loads(p.read_text())) for s, p in sorted(runs.items())}
    first = next(iter(per_seed.values()))
    mean = {group: {k: statistics.fmean(r[group][k] for r in per_seed.values()
                                        if r[group][k] is not None)
                    for k in first[group]}
            for group in ("overlap_at_10", "spearman", "gain_per_refreshed_prompt_theta")}
    mean["status_refresh_fraction"] = statistics.fmean(r["status_refresh_fraction"] for r in per_seed.values())
    out = {"seeds": sorted(per_seed), "per_seed": per_seed, "mean": mean,
           "goal": "at the farthest checkpoint, top-10% overlap >= 0.5 with at most 20% of the pool refreshed",
           "goal_met_by_mean": mean["overlap_at_10"]["status_refresh_theta"] >= 0.5
           and mean["status_refresh_fraction"] <= 0.2 + 1e-9,
           "goal_met_per_seed": {s: r["overlap_at_10"]["status_refresh_theta"] >= 0.5
                                 and r["status_refresh_fraction"] <= 0.2 + 1e-9 for s, r in per_seed.items()},
           "command": "python benchmarks/offpolicy_seeds.py"}
    (RESULTS / "offpolicy_seeds.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["mean"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
