"""Issue 27's decision: which selector becomes the default, by the rule fixed in docs/demo.md before the runs.

    cropi demo --task lists  --methods cropi,diverse,positive,full,random,pass_rate,informative,oracle --out L
    cropi demo --task skills --methods (the same) --out S
    python benchmarks/selectors_decision.py --report lists=L/report.json --report skills=S/report.json \\
        --out benchmarks/results/demo/selectors/decision.json

The rule: the default is the selector that beats ``informative`` on AUC and on the step acceleration at
75% and at 90% of full-pool training's gain (means over seeds) on every task. If none does, the best by
the same rule: the most of those comparisons won, ties broken by the mean AUC over the tasks. Full-pool
training, the oracle and informative itself are not candidates (see NOT_CANDIDATES).
The issue's goals are reported beside it for every candidate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# full is the reference (no selection: acceleration 1 by definition), informative the bar, and the oracle
# needs pools whose data_source names the targets: none of them is a selector a user could default to.
NOT_CANDIDATES = ("full", "oracle", "informative")
SHARES = ("0.75", "0.9")


def _mean(block: dict, method: str):
    return 1.0 if method == "full" else (block.get(method) or {}).get("mean")


def comparisons(report: dict, method: str) -> dict:
    """The rule's three comparisons with informative on one task, and the issue's goals."""
    auc = report["auc_by_method"]
    at = report["acceleration_at_share"]
    wall = report.get("wallclock_acceleration_at_share", {})
    mine = {"auc": auc[method]["mean"], **{f"steps@{q}": _mean(at[q], method) for q in SHARES},
            "wallclock@0.75": _mean(wall.get("0.75", {}), method)}
    theirs = {"auc": auc["informative"]["mean"], **{f"steps@{q}": _mean(at[q], "informative") for q in SHARES}}
    wins = {k: mine[k] is not None and theirs[k] is not None and mine[k] > theirs[k] for k in theirs}
    goals = {"auc_above_informative_and_full": wins["auc"] and mine["auc"] > auc["full"]["mean"],
             "steps@0.75>=2": (mine["steps@0.75"] or 0) >= 2, "steps@0.9>=1.2": (mine["steps@0.9"] or 0) >= 1.2,
             "wallclock@0.75>1": (mine["wallclock@0.75"] or 0) > 1}
    return {"value": mine, "informative": theirs, "beats_informative": wins, "goals": goals}


def decide(reports: dict[str, dict]) -> dict:
    methods = set.intersection(*(set(r["auc_by_method"]) for r in reports.values()))
    candidates = sorted(m for m in methods if m not in NOT_CANDIDATES)
    table = {m: {task: comparisons(r, m) for task, r in reports.items()} for m in candidates}
    wins = {m: sum(sum(t["beats_informative"].values()) for t in table[m].values()) for m in candidates}
    mean_auc = {m: sum(t["value"]["auc"] for t in table[m].values()) / len(reports) for m in candidates}
    rank = sorted(candidates, key=lambda m: (-wins[m], -mean_auc[m]))
    meets = [m for m in candidates if wins[m] == 3 * len(reports)]
    return {"rule": "beats informative on AUC, steps@75% and steps@90% (means over seeds) on every task; else "
                    "the most comparisons won, ties by mean AUC over the tasks",
            "tasks": sorted(reports), "candidates": candidates, "comparisons": table, "wins_of_6": wins,
            "mean_auc": mean_auc, "order": rank, "rule_met_by": meets, "default_selector": rank[0],
            "default_meets_rule": rank[0] in meets}


def run(doc: str, decide_fn, shown: tuple[str, ...]) -> None:
    """The decision scripts' command line: ``--report task=path`` per task, ``--out`` for the JSON."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--report", action="append", required=True, help="task=path/to/report.json (one per task)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    reports = {}
    for item in a.report:
        task, _, path = item.partition("=")
        reports[task] = json.loads(Path(path).read_text())
    result = decide_fn(reports)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: result[k] for k in shown}, indent=1))


def main() -> None:
    run(__doc__, decide, ("wins_of_6", "order", "rule_met_by", "default_selector"))


if __name__ == "__main__":
    main()
