"""What the checked curriculum's stage-0 race costs in AUC, read from committed demo reports (no run).

The race trains each arm one part from theta_0 and keeps the winner; the loser's part counts as spent, so
the curve of a checked run holds theta_0's accuracy for the race's first part (``--part`` steps) before the
winner's. Moving the curve that many steps to the left, and holding its last value to the end, gives the
AUC the same run would have had if the winner had been known beforehand: the race's price, per seed, against
full-pool training's AUC from the same report. The AUC is recomputed here from ``accuracy_by_step``
(trapezoids over steps, normalised by the span, the report's own definition), and it must equal the report's
``auc_by_method``.

    python benchmarks/race_tax.py --report benchmarks/results/demo/report.json \\
        --report benchmarks/results/demo/checked_refresh_skills/report.json \\
        --report benchmarks/results/demo/checked_round9/merged/conflict/report.json \\
        --out benchmarks/results/demo                                      ->  OUT/race_tax.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json  # noqa: E402

CHECKED = ("checked", "checked_refresh")  # the checked method's name in a report (revision 9's skills run: the latter)


def auc(curve: dict, shift: int = 0) -> float:
    steps = sorted(int(s) for s in curve)
    y = np.array([curve[str(s)]["sampled"] for s in steps])
    x = np.array(steps, dtype=float)
    if shift:
        y = np.concatenate([y[shift:], np.repeat(y[-1:], shift)])
    return float(np.trapezoid(y, x) / (x[-1] - x[0]))


def one(path: Path, part: int) -> dict:
    r = json.loads(path.read_text())
    name = next(m for m in CHECKED if m in r["accuracy_by_step"])
    curves = r["accuracy_by_step"][name]
    steps = sorted(int(s) for s in next(iter(curves.values())))
    shift = steps.index(part)  # evaluation points the race's part spans
    per_seed = {}
    for seed, curve in curves.items():
        recomputed = auc(curve)
        reported = r["auc_by_method"][name]["per_seed"][seed]
        if abs(recomputed - reported) > 1e-9:
            raise SystemExit(f"{path}: seed {seed}'s AUC recomputed {recomputed} is not the report's {reported}")
        per_seed[seed] = {"auc": recomputed, "auc_without_race_part": auc(curve, shift)}
    mean = {k: float(np.mean([v[k] for v in per_seed.values()])) for k in ("auc", "auc_without_race_part")}
    full = r["auc_by_method"]["full"]["mean"]
    return {"task": r["task"] if isinstance(r.get("task"), str) else r.get("task", {}).get("name"),
            "report": str(path), "method": name, "per_seed": per_seed, "mean": mean,
            "race_tax": mean["auc_without_race_part"] - mean["auc"], "full_auc": full,
            "gap_to_full": mean["auc"] - full, "gap_to_full_without_race_part": mean["auc_without_race_part"] - full}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", type=Path, action="append", required=True)
    p.add_argument("--part", type=int, default=10, help="steps of the race's losing part (the demo's: 10)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/demo"))
    a = p.parse_args(argv)
    result = {"command": "python benchmarks/race_tax.py " + " ".join(f"--report {r}" for r in a.report),
              "part_steps": a.part, "tasks": [one(path, a.part) for path in a.report]}
    write_json(a.out, "race_tax.json", result)
    for t in result["tasks"]:
        print(f"{t['task']}: AUC {t['mean']['auc']:.4f}, without the race's part {t['mean']['auc_without_race_part']:.4f} "
              f"(tax {t['race_tax']:+.4f}); full {t['full_auc']:.4f}")
    return result


if __name__ == "__main__":
    main()
