"""Where a race read a winner's gain over the stage's start at a look of its own, run by run (read from demo reports;
no run), with the run's AUC against the old revision's.

- ``--look winner_on`` (``check.race_gain_length: sequential``, round 30, docs/demo.md): where the winner trained on
  to read its gain again, that gain at its half and after its whole part, each in its SEs, and whether the whole
  part's is resolved. The candidate's premise was that the whole part reads about twice the half in SEs; ``summary``
  says how the two compare.
- ``--look first`` (``check.race_efficacy: stop``, round 31): where an unresolved first look stopped for the higher
  half's resolved gain, that gain and the arms' lead, each in its SEs, the arm that went on, and the arm the old
  revision's race picked after its whole part (``changed``: another arm, or none where the old run did not go on).

    python benchmarks/gain_looks.py --task T=NEW/report.json:OLD/report.json ... --new checked_gainseq \\
        --old checked [--look winner_on] --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit, report_pairs  # noqa: E402

from cropi.pipeline.curriculum.state import race_sides  # noqa: E402


def looks(new: dict, old: dict, new_method: str, old_method: str) -> list[dict]:
    """Each stage of each seed of ``new``'s method where the winner trained on (``race_gain_look.on``)."""
    out = []
    for seed, m, st, look in _acted(new, new_method, "race_gain_look", "on"):
        half, whole = look["gain"], st["race_start"]["gain"]  # the no-gain test read the whole part last
        out.append({"seed": seed, "stage": m, "winner": st["race_on"][0]["arm"],
                    "half_over_se": round(half["lead"] / half["se"], 3),
                    "whole_over_se": round(whole["lead"] / whole["se"], 3), "whole_resolved": whole["resolved"],
                    "auc_change": _auc_change(new, old, new_method, old_method, seed)})
    return out


def first_looks(new: dict, old: dict, new_method: str, old_method: str) -> list[dict]:
    """Each stage of each seed of ``new``'s method whose first look stopped for its gain (``race_first_look.
    gained``), against the same stage of ``old``'s run."""
    out = []
    for seed, m, st, look in _acted(new, new_method, "race_first_look", "gained"):
        before = old["checks"][old_method][seed].get(str(m), {})
        sides = race_sides(before)
        went_on = next(e["arm"] for e in st["race"] if e["race"] == "won")
        out.append({"seed": seed, "stage": m, "went_on": went_on, "old_went_on": sides[0]["arm"] if sides else None,
                    "old_whole_part": len(before.get("race_on") or []) == 2,
                    "changed": not sides or sides[0]["arm"] != went_on,
                    "gain_over_se": round(look["gain"]["lead"] / look["gain"]["se"], 3),
                    "critical": look["gain"]["critical"], "lead_over_se": round(look["lead"] / look["se"], 3),
                    "auc_change": _auc_change(new, old, new_method, old_method, seed)})
    return out


def _acted(report: dict, method: str, key: str, flag: str):
    """(seed, stage, stage record, its ``key`` record) of each stage of ``method``'s runs whose ``key`` record sets
    ``flag``, seeds and stages in order."""
    for seed, stages in sorted(report["checks"][method].items(), key=lambda kv: int(kv[0])):
        for m, st in sorted(stages.items(), key=lambda kv: int(kv[0])):
            look = st.get(key) or {}
            if look.get(flag):
                yield seed, int(m), st, look


def _auc_change(new: dict, old: dict, new_method: str, old_method: str, seed: str) -> float:
    change = new["auc_by_method"][new_method]["per_seed"][seed] - old["auc_by_method"][old_method]["per_seed"][seed]
    return round(change, 6)


LOOKS = {"winner_on": looks, "first": first_looks}


def summarize(tasks: dict[str, list[dict]], look: str = "winner_on") -> dict:
    rows = [r for t in tasks.values() for r in t]
    mean = lambda key: round(sum(r[key] for r in rows) / len(rows), 3) if rows else None  # noqa: E731
    if look == "first":
        changed = [r["auc_change"] for r in rows if r["changed"]]
        return {"runs": len(rows), "changed": len(changed),
                "mean_gain_over_se": mean("gain_over_se"), "mean_lead_over_se": mean("lead_over_se"),
                "mean_auc_change": mean("auc_change"),
                "mean_auc_change_changed": round(sum(changed) / len(changed), 3) if changed else None}
    return {"runs": len(rows), "whole_resolved": sum(r["whole_resolved"] for r in rows),
            "mean_half_over_se": mean("half_over_se"), "mean_whole_over_se": mean("whole_over_se"),
            "mean_auc_change": mean("auc_change")}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", action="append", required=True, help="task=new/report.json:old/report.json")
    ap.add_argument("--new", required=True, help="the candidate's method in the new reports")
    ap.add_argument("--old", required=True, help="the old revision's method in the old reports")
    ap.add_argument("--look", choices=sorted(LOOKS), default="winner_on", help="which look (above)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    tasks = {name: LOOKS[args.look](new, old, args.new, args.old)
             for name, (new, old) in report_pairs(args.task).items()}
    name = "gain_looks.json" if args.look == "winner_on" else "first_looks.json"
    return emit(args.out, name, {"command": command_line("benchmarks/gain_looks.py", argv),
                                 "summary": summarize(tasks, args.look), "tasks": tasks}, "summary")


if __name__ == "__main__":
    main()
