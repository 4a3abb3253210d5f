"""How far one method's runs spread over the seeds, per side of a round: its worst seed against ``full`` and the
seeds' standard deviation of its AUC (issue 32's round 20 reads these beside ``D``, deciding nothing).

    python benchmarks/seed_spread.py --side new --report lists=NEW/lists/report.json ... \\
        --side old --report lists=OLD/lists/report.json ... [--method checked] --out DIR

Per task ``t`` and seed ``s`` of a side: ``g = AUC(method) - AUC(full)``, paired by seed (both run on that seed).
Reported per side: the smallest ``g`` over every task and seed (the worst run against full-pool training, with
where it was), the mean over tasks of ``g``'s seeds' mean, and the mean over tasks of the standard deviation
(``n - 1``) of the method's AUC over the seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report_items, write_json  # noqa: E402


def spread(reports: dict[str, dict], method: str = "checked") -> dict:
    """``reports``: task -> a demo report holding ``method`` and ``full`` on the same seeds."""
    worst, per_task = None, {}
    for task, report in reports.items():
        own, full = (report["auc_by_method"][m]["per_seed"] for m in (method, "full"))
        if sorted(own) != sorted(full):
            raise SystemExit(f"{task}: {method} and full ran different seeds ({sorted(own)} against {sorted(full)})")
        gaps = {s: own[s] - full[s] for s in sorted(own, key=int)}
        per_task[task] = {"gap_to_full": gaps, "sd": statistics.stdev(own.values()) if len(own) > 1 else None}
        for s, g in gaps.items():
            if worst is None or g < worst["gap"]:
                worst = {"task": task, "seed": s, "gap": g}
    sds = [t["sd"] for t in per_task.values() if t["sd"] is not None]
    return {"tasks": per_task, "worst_to_full": worst,
            "mean_gap_to_full": statistics.fmean(statistics.fmean(t["gap_to_full"].values()) for t in per_task.values()),
            "mean_sd": statistics.fmean(sds) if sds else None}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", action="append", required=True, help="a side's name; its --report items follow it")
    ap.add_argument("--report", action="append", required=True, help="task=path/to/report.json")
    ap.add_argument("--method", default="checked")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    raw = sys.argv[1:] if argv is None else argv
    sides, current = {}, None
    for flag, value in zip(raw, raw[1:]):  # each --report belongs to the --side before it
        if flag == "--side":
            current = sides.setdefault(value, [])
        elif flag == "--report":
            if current is None:
                raise SystemExit("name a --side before its --report items")
            current.append(value)
    out = {"method": args.method, "definition": __doc__.split("\n\n")[2].strip(),
           "sides": {name: spread(dict(report_items(items)), args.method) for name, items in sides.items()}}
    write_json(args.out, "seed_spread.json", out)
    return out


if __name__ == "__main__":
    print(json.dumps({k: {m: v[m] for m in ("worst_to_full", "mean_gap_to_full", "mean_sd")}
                      for k, v in main()["sides"].items()}, indent=1))
