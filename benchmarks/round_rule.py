"""A check round's adoption rule, read from its ``paired.json`` and ``binding.json`` (rounds 26-28, docs/demo.md):
(1) every run where the candidate did not bind equals the old revision's bit for bit; (2) ``D >= 0`` over the tasks
of ``paired.json``; (3) on no task where it bound is the mean paired difference below ``-harm`` *and* below ``-2`` of
that task's own SE (``sqrt(var_s(d) / n)``, the seeds' unbiased variance). The candidate is adopted where all three
hold. A task of ``paired.json`` that ``binding.json`` lacks is one the round did not run because the rule cannot bind
there (round 29): paired as the record against itself, it counts in ``D`` as 0, and a nonzero difference on it breaks
(1).

    python benchmarks/round_rule.py --paired DIR/paired.json --binding DIR/binding.json \\
        [--reproduces T=NEW/T/report.json:RECORD/T/report.json ...] --out DIR

``--reproduces``: whether the old revision's method and ``full`` reran, in the new report, the committed record's
runs bit for bit (a round run on the machine of the record; its candidate may then be merged into the record).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report_pairs, write_json  # noqa: E402


def rule(paired: dict, binding: dict, harm: float = 0.02) -> dict:
    """The three conditions and the verdict; per task whether the candidate bound, its mean difference and SE."""
    tasks, changed_not_run = {}, []
    for task, v in paired["tasks"].items():
        if task not in binding["tasks"]:  # a task the round did not run: its pair is the record against itself
            tasks[task] = {"run": False, "bound": False, "mean": v["mean"], "se": 0.0, "harm": False}
            if any(d != 0 for d in v["differences"]):
                changed_not_run.append(task)
            continue
        bound = any(row["bound"] for row in binding["tasks"][task].values())
        se = math.sqrt(v["variance"] / len(v["differences"]))
        tasks[task] = {"bound": bound, "mean": v["mean"], "se": se,
                       "harm": bound and v["mean"] < -harm and v["mean"] < -2 * se}
    out = {"D": paired["D"], "SE": paired["SE"], "tasks_run": sorted(t for t in tasks if t in binding["tasks"]),
           "harm": harm, "unbound_equal": not binding["not_bound_but_different"] and not changed_not_run,
           "D_nonnegative": paired["D"] >= 0, "no_harm": not any(t["harm"] for t in tasks.values()), "tasks": tasks}
    if len(out["tasks_run"]) < len(tasks):
        out["tasks_not_run"] = sorted(t for t in tasks if t not in binding["tasks"])
        out["changed_but_not_run"] = changed_not_run
    out["adopted"] = out["unbound_equal"] and out["D_nonnegative"] and out["no_harm"]
    return out


def reproduces(pairs: dict[str, tuple[dict, dict]], methods: tuple[str, ...] = ("checked", "full")) -> dict:
    """Per task and method: the new report's curve equals the record's at every evaluated step."""
    return {task: {m: new["accuracy_by_step"][m] == old["accuracy_by_step"][m] for m in methods}
            for task, (new, old) in pairs.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paired", type=Path, required=True, help="benchmarks/paired_auc.py's output")
    ap.add_argument("--binding", type=Path, required=True, help="benchmarks/binding.py's output")
    ap.add_argument("--harm", type=float, default=0.02, help="condition 3's bound on a task's mean difference")
    ap.add_argument("--reproduces", action="append", default=[], help="task=new/report.json:record/report.json")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    out = rule(json.loads(a.paired.read_text()), json.loads(a.binding.read_text()), a.harm)
    if a.reproduces:
        out["reproduces_record"] = reproduces(report_pairs(a.reproduces))
    write_json(a.out, "rule.json", out)
    print(json.dumps({k: out[k] for k in ("D", "SE", "unbound_equal", "D_nonnegative", "no_harm", "adopted")}))
    return out


if __name__ == "__main__":
    main()
