"""Two checked methods' races side by side, run by run: each stage race's winner, whether its first look resolved,
its lead over its SE, and the run's AUC (read from demo reports; no run). For a round whose rule changes what a race
reads (round 21, docs/demo.md): where the picks and looks are the same the runs train the same steps, so their AUC
should be equal; where they differ, the AUC change is the rule's.

    python benchmarks/race_picks.py --task T=NEW/report.json:OLD/report.json ... --new checked_raceread \\
        --old checked --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit, report_pairs  # noqa: E402


def races(report: dict, method: str, seed: str) -> list[dict]:
    """A run's stage races: stage, winner, first look resolved (None: no first look), the deciding lead / SE."""
    out = []
    for m, st in sorted(report["checks"][method][seed].items(), key=lambda kv: int(kv[0])):
        lead = st.get("race_lead")
        if not lead:
            continue
        sides = st.get("race_on") or st.get("race") or []
        won = next((e["arm"] for e in sides if e.get("race") == "won"), None)
        look = st.get("race_first_look")
        out.append({"stage": int(m), "won": won, "first_look_resolved": look["resolved"] if look else None,
                    "lead_over_se": round(lead["lead"] / lead["se"], 3) if lead["se"] else None,
                    "resolved": lead["resolved"]})
    return out


def compare(new: dict, old: dict, new_method: str, old_method: str) -> dict:
    rows = {}
    for seed in sorted(new["checks"][new_method], key=int):
        a, b = races(new, new_method, seed), races(old, old_method, seed)
        auc_new = new["auc_by_method"][new_method]["per_seed"][seed]
        auc_old = old["auc_by_method"][old_method]["per_seed"][seed]
        same = [(r["stage"], r["won"], r["first_look_resolved"]) for r in a] == \
               [(r["stage"], r["won"], r["first_look_resolved"]) for r in b]
        rows[seed] = {"new": a, "old": b, "same_picks_and_looks": same, "auc_new": auc_new, "auc_old": auc_old,
                      "auc_change": round(auc_new - auc_old, 6)}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", action="append", required=True, help="task=new/report.json:old/report.json")
    ap.add_argument("--new", required=True)
    ap.add_argument("--old", required=True)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tasks = {name: compare(new, old, args.new, args.old) for name, (new, old) in report_pairs(args.task).items()}
    runs = [r for t in tasks.values() for r in t.values()]
    firsts = lambda side: [x["first_look_resolved"] for r in runs for x in r[side] if x["stage"] == 0]  # noqa: E731
    summary = {"runs": len(runs), "same_picks_and_looks": sum(r["same_picks_and_looks"] for r in runs),
               "same_but_auc_differs": sum(r["same_picks_and_looks"] and r["auc_change"] != 0 for r in runs),
               "stage0_first_looks_resolved": {"new": sum(map(bool, firsts("new"))), "old": sum(map(bool, firsts("old"))),
                                               "of": len(firsts("new"))},
               "auc_change_where_picks_differ": {
                   "n": sum(not r["same_picks_and_looks"] for r in runs),
                   "mean": (round(sum(r["auc_change"] for r in runs if not r["same_picks_and_looks"])
                                  / max(1, sum(not r["same_picks_and_looks"] for r in runs)), 6))}}
    emit(args.out, "race_picks.json", {"command": command_line("benchmarks/race_picks.py"), "summary": summary,
                                       "tasks": tasks}, "summary")


if __name__ == "__main__":
    main()
