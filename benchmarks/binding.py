"""Where a candidate rule bound, and that it changed nothing elsewhere: per task and seed, whether the candidate's
stage records carry the rule's mark, and whether its run equals the old revision's at every evaluated step.

    python benchmarks/binding.py --task T=NEW/T/report.json:OLD/T/report.json ... --new checked_unres \\
        --old checked_seq --mark race_unresolved --out DIR

A rule that binds only where its mark is recorded leaves every other run as it was, bit for bit (the
curriculum is deterministic on one machine): ``not_bound_but_different`` lists the runs that break that, and
``full_equal`` says whether ``full`` reran bit for bit in each pair of reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report_pairs, write_json  # noqa: E402


def binding(pairs: dict[str, tuple[dict, dict]], new: str, old: str, mark: str) -> dict:
    """``pairs``: task -> (the report with ``new``, the report with ``old``)."""
    tasks, full_equal = {}, {}
    for task, (a, b) in pairs.items():
        full_equal[task] = a["accuracy_by_step"]["full"] == b["accuracy_by_step"]["full"]
        rows = {}
        for seed in sorted(a["accuracy_by_step"][new], key=int):
            marks = {m: v for m, st in a["checks"][new][seed].items() if (v := _marked(st, mark))}
            rows[seed] = {"bound": marks or None,
                          "equal_to_old": a["accuracy_by_step"][new][seed] == b["accuracy_by_step"][old][seed],
                          "auc": a["auc_by_method"][new]["per_seed"][seed],
                          "auc_old": b["auc_by_method"][old]["per_seed"][seed]}
        tasks[task] = rows
    runs = [(t, s, v) for t, r in tasks.items() for s, v in r.items()]
    return {"new": new, "old": old, "mark": mark, "full_equal": full_equal, "tasks": tasks,
            "bound": sum(1 for *_, v in runs if v["bound"]),
            "not_bound_but_different": [[t, s] for t, s, v in runs if not v["bound"] and not v["equal_to_old"]]}


def _marked(stage: dict, mark: str):
    """The stage record's value at ``mark``, a key or a dotted path of keys (``race_start.no_gain``); None where
    any key is missing."""
    value = stage
    for key in mark.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", action="append", required=True, help="task=new/report.json:old/report.json")
    ap.add_argument("--new", required=True, help="the candidate's method in the new reports")
    ap.add_argument("--old", required=True, help="the old revision's method in the old reports")
    ap.add_argument("--mark", required=True, help="the stage record's key the rule writes where it binds (a dotted "
                                                  "path for a nested one: race_start.no_gain)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    out = binding(report_pairs(args.task), args.new, args.old, args.mark)
    write_json(args.out, "binding.json", out)
    print(json.dumps({k: out[k] for k in ("bound", "not_bound_but_different", "full_equal")}))
    return out


if __name__ == "__main__":
    main()
