"""What another set of arms in the checked curriculum's stage-0 race would have chosen, and its price in AUC,
read from committed demo reports (no run).

The race trains each arm one part from theta_0 (10 steps at the demo's settings) and keeps the arm that reads
higher; every loser's part counts as spent. An arm set ``A`` is read here from the *unchecked* runs of its arms:
the race's reading stands in as each arm's sampled test accuracy at the race's step (the test splits for the
validation reading a race takes: the same targets, sampled the same way, with more prompts); the winner's own
unchecked curve then follows ``len(A) - 1`` spent parts at theta_0's accuracy. The checked run's later parts
(its reversals, widening, re-races) are not modelled, so the default's own pair is read the same way beside the
others, and the checked run's reported AUC is given next to it. Beside that, the stage-0 races the checked runs
did take: each seed's lead of the winner over the loser on the validation sample (how far it is resolved:
benchmarks/race_noise.py).

    python benchmarks/race_arms.py --report lists=... --report skills=... --report conflict=... \\
        --report scarce=... --out benchmarks/results/demo                 ->  OUT/race_arms.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cropi.demo.acceleration import area_under_curve
from cropi.pipeline.curriculum.state import race_sides

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json  # noqa: E402

ARM_SETS = (("cropi", "diverse"), ("cropi", "informative"), ("diverse", "informative"),
            ("cropi", "diverse", "informative"), ("cropi", "diverse", "full"))
RACE_STEP = 10  # the race's part at the demo's settings (steps_per_stage 40 in 4 parts)


def delayed(curve: dict, steps: int) -> list[tuple[int, float]]:
    """The curve with its first ``steps`` steps spent at its start: the value at step ``x`` is the curve's at
    ``x - steps`` (its start before that), at the curve's own evaluated steps (``steps`` one of them)."""
    xs = sorted(int(s) for s in curve)
    at = {x: curve[str(x)]["sampled"] for x in xs}
    return [(x, at[xs[0]] if x - steps <= xs[0] else at[x - steps]) for x in xs]


def race(report: dict, arms: tuple[str, ...], step: int = RACE_STEP) -> dict | None:
    """Per seed, the arm reading highest at ``step`` (ties: the first listed) and the AUC of its curve after
    ``len(arms) - 1`` spent parts; None where a report lacks an arm."""
    by_step = report["accuracy_by_step"]
    if not all(a in by_step for a in arms):
        return None
    winners, aucs = {}, {}
    for seed in sorted(by_step[arms[0]]):
        read = {a: by_step[a][seed][str(step)]["sampled"] for a in arms}
        win = max(arms, key=lambda a: (read[a], -arms.index(a)))
        xs, ys = zip(*delayed(by_step[win][seed], (len(arms) - 1) * step))
        winners[seed], aucs[seed] = win, round(area_under_curve(xs, ys), 4)  # the report's AUC
    return {"winners": winners, "auc_per_seed": aucs, "auc": round(sum(aucs.values()) / len(aucs), 4)}


def checked_races(report: dict, method: str = "checked") -> dict:
    """Per seed, the stage-0 race the checked run took: the winner, the loser and the winner's lead (on the race's
    own reading where it has one, ``race_objective``); with its
    paired SE and whether it is resolved where the report's checks carry the race's ``race_lead`` (reports
    before it hold only the arms' objectives: benchmarks/race_noise.py reads the SE from the runs' records)."""
    out = {}
    for seed, stages in report.get("checks", {}).get(method, {}).items():
        rec = stages.get("0") or {}
        sides = race_sides(rec)
        if sides is None:
            continue
        won, lost = sides
        read = "race_objective" if "race_objective" in won and "race_objective" in lost else "objective"
        out[seed] = {"won": won["arm"], "lost": lost["arm"],  # on what the race read (revision 22: its own sample)
                     "lead": round(won[read] - lost[read], 4)}
        noise = rec.get("race_lead")
        if noise:
            out[seed] |= {k: noise[k] for k in ("se", "df", "critical", "resolved")}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="append", required=True, help="TASK=path/to/report.json")
    ap.add_argument("--out", type=Path, help="folder for race_arms.json")
    args = ap.parse_args(argv)
    result = {"definition": __doc__.split("\n\n")[1].replace("\n", " "), "race_step": RACE_STEP, "tasks": {}}
    for item in args.report:
        task, path = item.split("=", 1)
        report = json.loads(Path(path).read_text())
        reported = {m: round(v["mean"], 4) for m, v in report["auc_by_method"].items()}
        result["tasks"][task] = {"reported_auc": reported,
                                 "arm_sets": {"+".join(a): race(report, a) for a in ARM_SETS},
                                 "checked_stage0_races": checked_races(report)}
    if args.out:
        write_json(args.out, "race_arms.json", result)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
