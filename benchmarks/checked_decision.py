"""Issue 32's decision: does the checked stage meet its goals, and is it the default, by the rule fixed in
docs/demo.md ("Selection that checks its own effect") before the runs.

    cropi demo --task lists  --out L      # the default methods: checked, cropi, diverse, full, random,
    cropi demo --task skills --out S      #   pass_rate, informative, oracle; 3 seeds
    cropi demo --task scarce --out C
    python benchmarks/checked_decision.py --report lists=L/report.json --report skills=S/report.json \\
        --report scarce=C/report.json --out benchmarks/results/demo/checked/decision.json

The goals, per task (means over seeds): the default's AUC at least the larger of ``full`` and
``informative``, and at least the larger of ``cropi`` and ``diverse`` minus 0.02; at 90% of full-pool
training's gain at least 1.5x wherever ``cropi`` or ``diverse`` reaches 1.5x; on ``skills`` 75% reached on
every seed (not censored); the checks at most 15% of a stage's seconds (and, on lists, scoring plus
checks at most 60% of a stage's training). The default: ``checked`` if it meets them all; else still
``checked`` when it wins more of these comparisons than ``cropi`` and ``diverse`` do, judged by the
same comparisons as candidates themselves.
"""

from __future__ import annotations


DEFAULT = "checked"
RIVALS = ("cropi", "diverse")


def _mean(block: dict, method: str):
    return 1.0 if method == "full" else (block.get(method) or {}).get("mean")


def goals(report: dict, task: str, method: str) -> dict:
    """The issue's goals for ``method`` on one task: each with its value and the bar."""
    auc = {m: v["mean"] for m, v in report["auc_by_method"].items()}
    at = report["acceleration_at_share"]
    out = {
        "auc>=max(full,informative)": {"value": auc[method], "bar": max(auc["full"], auc.get("informative", 0))},
        "auc>=max(cropi,diverse)-0.02": {"value": auc[method],
                                          "bar": max(auc.get(r, 0) for r in RIVALS) - 0.02},
    }
    best_rival = max((_mean(at["0.9"], r) or 0) for r in RIVALS)
    if best_rival >= 1.5:
        out["steps@0.9>=1.5"] = {"value": _mean(at["0.9"], method) or 0, "bar": 1.5}
    if task == "skills":
        censored = (at["0.75"].get(method) or {}).get("censored", [])
        out["skills@0.75 not censored"] = {"value": -len(censored), "bar": 0}
    shares = (report.get("cost_shares") or {}).get(method)
    if shares and method == DEFAULT:
        out["checks<=15% of a stage"] = {"value": -shares["checks_of_stage"], "bar": -0.15}
        if task == "lists":
            out["(scoring+checks)<=60% of training"] = {"value": -shares["scoring_and_checks_over_training"],
                                                         "bar": -0.6}
    for g in out.values():
        g["met"] = g["value"] is not None and g["value"] >= g["bar"] - 1e-12
    return out


def decide(reports: dict[str, dict]) -> dict:
    table = {m: {task: goals(r, task, m) for task, r in reports.items()} for m in (DEFAULT, *RIVALS)
             if all(m in r["auc_by_method"] for r in reports.values())}
    met = {m: sum(g["met"] for t in tasks.values() for g in t.values()) for m, tasks in table.items()}
    total = {m: sum(len(t) for t in tasks.values()) for m, tasks in table.items()}
    all_met = met.get(DEFAULT) == total.get(DEFAULT)
    wins = all_met or all(met.get(DEFAULT, 0) > met[r] for r in RIVALS if r in met)
    return {"rule": "checked is the default if it meets every goal, else if it meets more of them than cropi and "
                    "diverse each do (judged by the same comparisons)",
            "tasks": sorted(reports), "goals": table, "met": met, "of": total,
            "checked_meets_every_goal": all_met, "default": DEFAULT if wins else max(met, key=met.get),
            "auc": {task: {m: v["mean"] for m, v in r["auc_by_method"].items()} for task, r in reports.items()},
            "steps@0.9": {task: {m: _mean(r["acceleration_at_share"]["0.9"], m) for m in r["auc_by_method"]}
                          for task, r in reports.items()},
            "cases": {task: r.get("check_cases", {}).get(DEFAULT) for task, r in reports.items()},
            "cost_shares": {task: r.get("cost_shares", {}).get(DEFAULT) for task, r in reports.items()}}


def main() -> None:
    from selectors_decision import run  # the decision scripts' one command line (a script's folder is on its path)

    run(__doc__, decide, ("met", "of", "checked_meets_every_goal", "default"))


if __name__ == "__main__":
    main()
