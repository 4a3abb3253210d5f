"""Where a race's winner read below the stage's start (exploratory: it decides nothing; docs/demo.md, "after the
fresh readings of revision 22").

A race compares its two arms with each other, never with the checkpoint both started from. Where both ranked subsets
lower the targets, the race still sends the higher on. Here the stage's start is read on the race's own sample (every
validation prompt but the confirmation sample, at the race's recorded draws, on the stream the race read its arms
on, so the readings pair prompt by prompt), for every race of finished checked curricula, and the winner's last
reading is compared with it: ``fell`` where the start's lead over the winner is resolved at the check's alpha
(``chk.race_lead``, the race's own test).

    python benchmarks/race_fell.py --work TASK=DEMO_DIR ... [--method checked_raceread,checked] --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit  # noqa: E402

from cropi.data.readers import load_prompts  # noqa: E402
from cropi.pipeline.curriculum import check as chk  # noqa: E402


def races(state: dict) -> list[tuple[int, dict]]:
    """(stage, its check record) of every stage that raced its arms."""
    return [(st["index"], st["check"]) for st in state["stages"] if (st.get("check") or {}).get("raced")]


def read_run(run: Path) -> list[dict]:
    state = json.loads((run / "state.json").read_text())
    config = state["config"]
    sets = {name: load_prompts(path) for name, path in config["validation"].items()}
    opts = config["trainer_options"]
    sampling = {"reward": config["reward"], "temperature": opts.get("temperature", 1.0),
                "max_new_tokens": opts["max_new_tokens"]}
    alpha = config.get("check", {}).get("alpha", 0.05)
    out = []
    for m, record in races(state):
        plan = record["plan"]
        legs = record.get("race_on") or record["race"]
        winner = next(e for e in legs if e.get("race") == "won")
        if "race_values" not in winner:  # a race read on the check's sample (before revision 22): not read here
            continue
        _, held_out = chk.ValidationSample.draw_pair(sets, plan["prompts_per_set"], config["seed"], plan["samples"])
        rest = chk.ValidationSample.beside(sets, held_out, config["seed"], plan["samples"])
        sample = chk.ValidationSample(rest.records, config["seed"], winner["race_draws"])
        start, _ = sample.measure(record["start"]["checkpoint"], **sampling)
        won = chk.from_lists(winner["race_values"])
        lead = chk.race_lead(start, won, alpha, plan.get("test", "normal"))
        out.append({"stage": m, "winner": winner["arm"], "start": round(chk.objective(start), 4),
                    "winner_objective": winner["race_objective"], "start_over_winner": lead,
                    "fell": bool(lead["lead"] > 0 and lead["resolved"])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", action="append", required=True, help="TASK=DEMO_DIR (a demo folder with checked runs)")
    ap.add_argument("--method", default="checked",
                    help="the checked method's run name; comma-separated, the first a folder has runs of is read")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = {"command": command_line("benchmarks/race_fell.py"), "runs": {}}
    for item in args.work:
        task, _, folder = item.partition("=")
        curricula = Path(folder) / "runs" / "curricula"
        method = next((m for m in args.method.split(",") if any(curricula.glob(f"{m}-seed*"))), args.method)
        for run in sorted(curricula.glob(f"{method}-seed*")):
            result["runs"][f"{task}/{run.name}"] = r = read_run(run)
            print(task, run.name, [(x["stage"], x["winner"], x["start"], x["winner_objective"], x["fell"]) for x in r],
                  flush=True)
    fell = sorted(k for k, v in result["runs"].items() if any(x["fell"] for x in v))
    result["summary"] = {"races": sum(len(v) for v in result["runs"].values()),
                         "fell": sum(x["fell"] for v in result["runs"].values() for x in v), "runs_where_fell": fell}
    emit(args.out, "race_fell.json", result, "summary")


if __name__ == "__main__":
    main()
