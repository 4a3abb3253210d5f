"""Does influence selection gain more over the whole pool and the controls at another learning rate? (exploratory:
it decides nothing; docs/demo.md, "how long a ranking holds, and the demo's learning rate").

Per task, two demo reports of the same task at two learning rates (``--pair TASK=BASE.json,OTHER.json``). In each,
the influence side is the better of ``cropi`` and ``checked`` by mean AUC and the control side the better of
``full`` and ``informative``; per seed the gap is the influence side's AUC less the control side's. The reading is
the other rate's mean gap less the base rate's, with the SE of that difference over seeds (Welch: the runs are
not paired across rates), and whether it exceeds one SE, as the design fixed.

    python benchmarks/rate_gap.py --pair lists=BASE/report.json,OTHER/report.json ... --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit  # noqa: E402

INFLUENCE, CONTROLS = ("cropi", "checked"), ("full", "informative")


def gaps(report: dict) -> dict:
    """The report's better influence method and better control by mean AUC, and per seed the first's AUC less the
    second's."""
    auc = report["auc_by_method"]
    best = lambda side: max(side, key=lambda m: auc[m]["mean"])  # noqa: E731
    influence, control = best(INFLUENCE), best(CONTROLS)
    seeds = sorted(set(auc[influence]["per_seed"]) & set(auc[control]["per_seed"]), key=int)
    per_seed = {s: auc[influence]["per_seed"][s] - auc[control]["per_seed"][s] for s in seeds}
    return {"lr": report["settings"]["lr"], "influence": influence, "control": control,
            "auc": {m: auc[m]["mean"] for m in (*INFLUENCE, *CONTROLS)}, "gap_per_seed": per_seed,
            "gap": float(np.mean(list(per_seed.values())))}


def compare(base: dict, other: dict) -> dict:
    a, b = (np.array(list(g["gap_per_seed"].values())) for g in (base, other))
    se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    diff = float(b.mean() - a.mean())
    return {"base": base, "other": other, "gap_change": diff, "se": se, "beyond_one_se": abs(diff) > se}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pair", action="append", required=True, help="TASK=BASE_REPORT,OTHER_REPORT (repeatable)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    tasks = {}
    for item in args.pair:
        task, paths = item.split("=", 1)
        base, other = (gaps(json.loads(Path(x).read_text())) for x in paths.split(","))
        tasks[task] = compare(base, other)
    summary = {t: {"base_lr": r["base"]["lr"], "other_lr": r["other"]["lr"], "base_gap": r["base"]["gap"],
                   "other_gap": r["other"]["gap"], "gap_change": r["gap_change"], "se": r["se"],
                   "beyond_one_se": r["beyond_one_se"]} for t, r in tasks.items()}
    result = {"benchmark": "rate_gap", "command": command_line("benchmarks/rate_gap.py", argv),
              "tasks": tasks, "summary": summary}
    return emit(args.out, "rate_gap.json", result, "summary")


if __name__ == "__main__":
    main()
