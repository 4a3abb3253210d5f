"""Where a race's winner trained on to read its gain again (``check.race_gain_length: sequential``, round 30,
docs/demo.md): run by run, the winner's gain over the stage's start at its half and after its whole part, each in
its SEs, whether the whole part's is resolved, and the run's AUC against the old revision's (read from demo
reports; no run). The candidate's premise was that the gain read after the whole part is about twice the half's in
SEs; ``summary`` says how the two compare over the runs where it acted.

    python benchmarks/gain_looks.py --task T=NEW/report.json:OLD/report.json ... --new checked_gainseq \\
        --old checked --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit, report_pairs  # noqa: E402


def looks(new: dict, old: dict, new_method: str, old_method: str) -> list[dict]:
    """Each stage of each seed of ``new``'s method where the winner trained on (``race_gain_look.on``)."""
    out = []
    for seed, stages in sorted(new["checks"][new_method].items(), key=lambda kv: int(kv[0])):
        for m, st in sorted(stages.items(), key=lambda kv: int(kv[0])):
            look = st.get("race_gain_look") or {}
            if not look.get("on"):
                continue
            half, whole = look["gain"], st["race_start"]["gain"]  # the no-gain test read the whole part last
            out.append({"seed": seed, "stage": int(m), "winner": st["race_on"][0]["arm"],
                        "half_over_se": round(half["lead"] / half["se"], 3),
                        "whole_over_se": round(whole["lead"] / whole["se"], 3), "whole_resolved": whole["resolved"],
                        "auc_change": round(new["auc_by_method"][new_method]["per_seed"][seed]
                                            - old["auc_by_method"][old_method]["per_seed"][seed], 6)})
    return out


def summarize(tasks: dict[str, list[dict]]) -> dict:
    rows = [r for t in tasks.values() for r in t]
    mean = lambda key: round(sum(r[key] for r in rows) / len(rows), 3) if rows else None  # noqa: E731
    return {"runs": len(rows), "whole_resolved": sum(r["whole_resolved"] for r in rows),
            "mean_half_over_se": mean("half_over_se"), "mean_whole_over_se": mean("whole_over_se"),
            "mean_auc_change": mean("auc_change")}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", action="append", required=True, help="task=new/report.json:old/report.json")
    ap.add_argument("--new", required=True, help="the candidate's method in the new reports")
    ap.add_argument("--old", required=True, help="the old revision's method in the old reports")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    tasks = {name: looks(new, old, args.new, args.old) for name, (new, old) in report_pairs(args.task).items()}
    return emit(args.out, "gain_looks.json", {"command": command_line("benchmarks/gain_looks.py", argv),
                                              "summary": summarize(tasks), "tasks": tasks}, "summary")


if __name__ == "__main__":
    main()
