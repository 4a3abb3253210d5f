"""Where a race's gain over the stage's start was resolved, split by what won the task (exploratory: it decides
nothing; docs/demo.md, "Round 25 candidate").

Reads ``race_fell.json`` (every race's winner read beside the stage's start on the race's own sample, the start's
lead over the winner tested at the check's alpha) and a ``heldout_regret.json`` (each task's AUC per method). A race's
*gain* is the winner's lead over the start; it is *resolved* where it exceeds the race's one-sided critical value
times its SE. A task is *broad* where the better of the two draws that use no ranking (``full``, ``informative``)
beat the better of the two ranked rules (``cropi``, ``diverse``) on AUC.

    python benchmarks/race_gain_split.py --races race_fell.json --regret heldout_regret.json --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit  # noqa: E402


def gain_of(race: dict) -> dict:
    """The winner's gain over the start, its SE and whether it is resolved (``start_over_winner`` negated)."""
    read = race["start_over_winner"]
    gain = -read["lead"]
    return {"gain": round(gain, 6), "se": read["se"], "resolved": bool(gain > read["critical"] * read["se"])}


def split(races: dict, regret: dict) -> dict:
    """Per task its races' gains and whether it is broad; per side (broad or ranked) the races and how many of them
    left their gain unresolved."""
    tasks, sides = {}, {"broad": {"tasks": 0, "races": 0, "unresolved": 0},
                        "ranked": {"tasks": 0, "races": 0, "unresolved": 0}}
    by_task: dict[str, list[dict]] = {}
    for run, entries in sorted(races["runs"].items()):
        task = run.split("/")[0]
        by_task.setdefault(task, []).extend({"run": run, "stage": e["stage"], **gain_of(e)} for e in entries)
    for task, entries in sorted(by_task.items()):
        auc = regret["tasks"][task]["auc"]
        margin = max(auc["full"], auc["informative"]) - max(auc["cropi"], auc["diverse"])
        side = "broad" if margin > 0 else "ranked"
        tasks[task] = {"side": side, "broad_over_ranked": round(margin, 4), "races": entries}
        sides[side]["tasks"] += 1
        sides[side]["races"] += len(entries)
        sides[side]["unresolved"] += sum(not e["resolved"] for e in entries)
    return {"tasks": tasks, "summary": sides}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--races", type=Path, required=True, help="race_fell.json (benchmarks/race_fell.py)")
    ap.add_argument("--regret", type=Path, required=True, help="heldout_regret.json (benchmarks/heldout_regret.py)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    result = split(json.loads(args.races.read_text()), json.loads(args.regret.read_text()))
    result["command"] = command_line("race_gain_split.py", argv)
    return emit(args.out, "race_gain_split.json", result, "summary")


if __name__ == "__main__":
    main()
