"""When does the whole pool's lead over a selected subset first show? Read off committed demo reports.

    python benchmarks/early_readings.py \\
        --report lists=benchmarks/results/demo/report.json \\
        --report skills=benchmarks/results/demo/checked_skills/report.json \\
        --report conflict=benchmarks/results/demo/checked_conflict/report.json \\
        --out benchmarks/results/demo/early_readings.json

Round 4 (docs/demo.md) left one candidate for a later round of the check: race the whole pool as a third arm
at stage 0, so that a task whose subsets all lose to the pool (``skills``) is found before a subset has done
its harm. A race decides on the arms' readings after its part (10 steps at the demo's settings). This reads
the unchecked runs' sampled test accuracy at the evaluated steps, per seed, and counts the seeds on which
``full`` reads above the better of ``cropi`` and ``diverse`` (the checked run's two arms) at each step: the
step at which a race of that length would first have picked the pool. Test splits stand in for the
validation reading the race takes (the same targets, sampled the same way); nothing here is an input to any
run, and no run was made for it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ARMS = ("cropi", "diverse")
STEPS = (10, 20, 30, 40, 80, 200)


def readings(report: dict) -> dict:
    """step -> {method: mean sampled accuracy, pool_leads: seeds where full > the better arm, seeds}."""
    by_step = report["accuracy_by_step"]
    seeds = sorted(by_step["full"])
    out = {}
    for step in map(str, STEPS):
        if not all(step in by_step[m][s] for m in ("full", *ARMS) for s in seeds):
            continue
        at = {m: [by_step[m][s][step]["sampled"] for s in seeds] for m in ("full", "random", *ARMS) if m in by_step}
        leads = sum(at["full"][i] > max(at[a][i] for a in ARMS) for i in range(len(seeds)))
        out[step] = {**{m: round(sum(v) / len(v), 4) for m, v in at.items()}, "pool_leads": leads,
                     "seeds": len(seeds)}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="append", required=True, help="TASK=path/to/report.json")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    result = {"definition": "mean sampled test accuracy of each unchecked run at the evaluated step; pool_leads: "
                            "seeds on which full reads above the better of cropi and diverse there",
              "tasks": {}}
    for item in args.report:
        task, path = item.split("=", 1)
        result["tasks"][task] = readings(json.loads(Path(path).read_text()))
    text = json.dumps(result, indent=1) + "\n"  # steps in their order
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return result


if __name__ == "__main__":
    main()
