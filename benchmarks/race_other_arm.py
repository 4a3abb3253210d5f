"""What the arm a stage-0 race did not keep would have given, by how the race and its stage went (exploratory: it
decides nothing).

For every ``checked`` run in the given demo reports: whether its stage-0 race's last look resolved the lead at the
check's alpha (``race_lead``), whether stage 0 then ended ``flat`` (no resolved change over its start), and the
AUC of the fixed rule of the *other* arm on the same seed less the run's own. A rule that races again after an
unresolved race and a flat stage 0 can gain only where that difference is positive, so its mean in that group
bounds what such a re-race could be worth, before its tax.

    python benchmarks/race_other_arm.py --report TASK=DIR/report.json ... --out DIR
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, report_items  # noqa: E402

GROUPS = {"resolved": lambda r: r["resolved"],
          "unresolved, stage 0 flat": lambda r: not r["resolved"] and r["stage0_flat"],
          "unresolved, stage 0 not flat": lambda r: not r["resolved"] and not r["stage0_flat"]}


def runs(report: dict, task: str, method: str = "checked") -> list[dict]:
    """One row per seed of ``method`` whose stage 0 raced."""
    auc = report["auc_by_method"]
    out = []
    for seed, stages in report["checks"].get(method, {}).items():
        first = stages.get("0") or {}
        lead = first.get("race_lead")
        if not lead:
            continue
        kept = first["end"]["arm"]
        other = next(a for a in first["plan"]["arms"] if a != kept)
        mine = auc[method]["per_seed"][seed]
        theirs = auc.get(other, {}).get("per_seed", {}).get(seed)
        out.append({"task": task, "seed": seed, "kept": kept, "other": other, "resolved": lead["resolved"],
                    "lead_over_se": round(lead["lead"] / lead["se"], 3) if lead["se"] else None,
                    "stage0_flat": first["end"]["cases"] == ["flat"], "auc": mine, "other_fixed_auc": theirs,
                    "other_minus_run": None if theirs is None else round(theirs - mine, 6)})
    return out


def summary(rows: list[dict]) -> dict:
    out = {}
    for name, keep in GROUPS.items():
        d = [r["other_minus_run"] for r in rows if keep(r) and r["other_minus_run"] is not None]
        out[name] = {"runs": len(d), "mean": round(statistics.mean(d), 6) if d else None,
                     "median": round(statistics.median(d), 6) if d else None,
                     "other_better": sum(x > 0 for x in d)}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", action="append", required=True, help="TASK=a demo report.json (repeat)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    rows = [row for task, report in report_items(a.report) for row in runs(report, task)]
    payload = {"command": "python benchmarks/race_other_arm.py " + " ".join(f"--report {r}" for r in a.report)
               + (f" --out {a.out}" if a.out else ""), "definition": __doc__.split("\n\n")[1].replace("\n", " "),
               "summary": summary(rows), "runs": rows}
    return emit(a.out, "race_other_arm.json", payload, "summary")

if __name__ == "__main__":
    main()
