"""What the pool's revisits did (exploratory: it decides nothing; docs/demo.md, "What round 26 found"): per run of a
checked method, each stage's revisit (``check.pool_revisit: race``): which subset read higher, whether its lead was
resolved, which went on, and the steps its loser spent; per task and in all, how many revisits ended each way.

A revisit ends one of three ways: the ranked subset's lead resolved (it went on, unless the no-gain test over the
start sent the pool on again), the pool's lead resolved (no later stage revisits), or neither (the pool went on and
the next stage revisits again).

    python benchmarks/revisit_outcomes.py --report TASK=path/report.json ... [--method checked_revisit] --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit, report_items  # noqa: E402

ENDS = ("ranked_resolved", "pool_resolved", "neither")


def outcome(revisit: dict) -> str:
    """How a revisit ended: whose lead was resolved, or neither's."""
    if not revisit["lead"]["resolved"]:
        return "neither"
    return "ranked_resolved" if revisit["higher"] == "ranked" else "pool_resolved"


def lost_steps(stage: dict) -> int:
    """The steps a stage's race spent on its loser (both halves of a sequential race)."""
    return sum(e.get("steps") or 0 for e in (*stage.get("race", []), *stage.get("race_on", []))
               if e.get("race") == "lost")


def outcomes(reports: list[tuple[str, dict]], method: str) -> dict:
    tasks, total = {}, dict.fromkeys(ENDS, 0) | {"revisits": 0, "runs": 0, "lost_steps": 0, "went_on_ranked": 0}
    for task, report in reports:
        runs, counts = {}, dict.fromkeys(ENDS, 0) | {"revisits": 0, "lost_steps": 0, "went_on_ranked": 0}
        for seed, stages in sorted(report["checks"].get(method, {}).items()):
            rows = [{"stage": int(m), "higher": st["revisit"]["higher"], "went_on": st["revisit"]["went_on"],
                     "lead": st["revisit"]["lead"]["lead"], "se": st["revisit"]["lead"]["se"],
                     "end": outcome(st["revisit"]), "lost_steps": lost_steps(st)}
                    for m, st in sorted(stages.items(), key=lambda kv: int(kv[0])) if st.get("revisit")]
            if not rows:
                continue
            runs[seed] = rows
            for r in rows:
                counts[r["end"]] += 1
                counts["revisits"] += 1
                counts["lost_steps"] += r["lost_steps"]
                counts["went_on_ranked"] += r["went_on"] == "ranked"
        if runs:
            tasks[task] = {"runs": runs, "counts": counts}
            for k, v in counts.items():
                total[k] += v
            total["runs"] += len(runs)
    return {"method": method, "tasks": tasks, "summary": total}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", action="append", required=True, help="TASK=path/to/report.json")
    ap.add_argument("--method", default="checked_revisit")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    result = outcomes(report_items(args.report), args.method)
    result["command"] = command_line("revisit_outcomes.py", argv)
    return emit(args.out, "revisit_outcomes.json", result, "summary")


if __name__ == "__main__":
    main()
