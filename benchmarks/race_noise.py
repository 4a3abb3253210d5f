"""What the checked curriculum's races resolve: each race's lead, its paired standard error, and what the
losing arm did over the run where the lead was within the noise (read from finished runs; no run).

A race trains both arms one part from the same checkpoint and reads both on the stage's validation sample,
the same prompts and random stream (cropi.pipeline.curriculum.check.race_lead): its lead over its SE is the
paired t statistic of the decision. For each stage-0 race the unchecked runs of both arms on the same seed
(the report's ``accuracy_by_step``) say which arm did better over the whole run, so whether following an
unresolved race's winner, or the primary, would have paid.

    python benchmarks/race_noise.py --runs lists=RUN_DIR --report lists=report.json ... --out DIR
        [--source TEXT] (RUN_DIR: a demo's ``runs/curricula``, ``TASK:METHOD=`` where the checked method has
        another name; the report: one with the arms' unchecked runs)                     -> DIR/race_noise.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cropi.demo.report import auc
from cropi.pipeline.curriculum.check import CheckOptions, from_lists, race_lead
from cropi.pipeline.curriculum.state import race_sides

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, task_reports  # noqa: E402


def seed_auc(report: dict, method: str, seed: str) -> float | None:
    """The run's AUC as the report computes it (cropi.demo.report.auc); None if not run."""
    by_step = report.get("accuracy_by_step", {})
    return auc(by_step, method)["per_seed"].get(seed) if method in by_step else None


def races(state: dict, alpha: float) -> list[dict]:
    """Every race of one checked curriculum (its ``state.json``): stage, arms, and ``race_lead``."""
    out = []
    for m, stage in enumerate(state["stages"]):
        record = stage.get("check") or {}
        sides = race_sides(record)
        if sides is None:
            continue
        won, lost = sides
        lead = race_lead(from_lists(won["values"]), from_lists(lost["values"]), alpha,
                         record["plan"].get("test", "normal"))
        out.append({"stage": m, "won": won["arm"], "lost": lost["arm"], "primary": record["plan"]["arms"][0]} | lead)
    return out


def task_races(runs: Path, report: dict, method: str, alpha: float) -> dict:
    """seed -> the checked run's races, each stage-0 race with both arms' unchecked AUC on that seed."""
    out = {}
    for state_file in sorted(runs.glob(f"{method}-seed*/state.json")):
        seed = state_file.parent.name.rsplit("-seed", 1)[1]
        found = races(json.loads(state_file.read_text()), alpha)
        for r in found:
            if r["stage"] == 0:
                won, lost = seed_auc(report, r["won"], seed), seed_auc(report, r["lost"], seed)
                if won is not None and lost is not None:
                    r["unchecked_auc"] = {"won": round(won, 4), "lost": round(lost, 4)}
        out[seed] = found
    return out


def summary(tasks: dict) -> dict:
    """Over the stage-0 races with both arms' unchecked runs, resolved and not: how many, in how many the
    loser's run had the higher AUC, the mean AUC of winner minus loser, of the primary minus the other, of the
    primary minus the winner (what going on with the primary instead of the winner would have changed), and of the
    fallback (the other arm) minus the winner (what going on with the fallback would have changed)."""
    out = {}
    for resolved in (True, False):
        rows = [r for seeds in tasks.values() for rs in seeds.values() for r in rs
                if r["stage"] == 0 and r["resolved"] is resolved and "unchecked_auc" in r]
        if not rows:
            out["resolved" if resolved else "unresolved"] = {"n": 0}
            continue
        gaps = [r["unchecked_auc"]["won"] - r["unchecked_auc"]["lost"] for r in rows]
        primary = [g if r["won"] == r["primary"] else -g for r, g in zip(rows, gaps)]
        switched = [0.0 if r["won"] == r["primary"] else -g for r, g in zip(rows, gaps)]  # the primary over the winner
        fallback = [0.0 if r["won"] != r["primary"] else -g for r, g in zip(rows, gaps)]  # the other arm over it
        out["resolved" if resolved else "unresolved"] = {
            "n": len(rows), "loser_higher": sum(g < 0 for g in gaps),
            "mean_auc_winner_minus_loser": round(sum(gaps) / len(gaps), 4),
            "mean_auc_primary_minus_other": round(sum(primary) / len(primary), 4),
            "mean_auc_primary_minus_winner": round(sum(switched) / len(switched), 4),
            "mean_auc_fallback_minus_winner": round(sum(fallback) / len(fallback), 4)}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", action="append", required=True, help="TASK=path/to/runs/curricula")
    ap.add_argument("--report", action="append", required=True, help="TASK=path/to/report.json (unchecked arms)")
    ap.add_argument("--method", default="checked", help="the checked method's name in the run folders")
    ap.add_argument("--alpha", type=float, default=CheckOptions().alpha, help="the level a lead is resolved at")
    ap.add_argument("--source", default="", help="which committed reports' runs --runs are, as a reader elsewhere "
                                                 "finds them (the run folders' paths are this machine's: not recorded)")
    ap.add_argument("--out", type=Path, help="folder for race_noise.json")
    args = ap.parse_args(argv)
    reports = task_reports(args.report)
    tasks = {}
    for item in args.runs:
        task, path = item.split("=", 1)
        method = args.method
        if ":" in task:  # TASK:METHOD, where a round's folder names the revision
            task, method = task.split(":", 1)
        tasks[task] = task_races(Path(path), reports[task], method, args.alpha)
    result = {"definition": __doc__.split("\n\n")[1].replace("\n", " "), "source": args.source, "alpha": args.alpha,
              "tasks": tasks, "stage0": summary(tasks)}
    return emit(args.out, "race_noise.json", result, "stage0")


if __name__ == "__main__":
    main()
