"""What an update on half a step's batch gains against one on the whole (exploratory: it decides nothing; docs/demo.md,
"after round 22").

A race whose arms each train on half of every step's batch, side by side from one checkpoint, spends the samples of
one arm: ``h`` updates an arm cost ``h`` steps, not ``2h``. Whether that is nearly free depends on what a half-batch
update gains. Here each stage-0 race arm of a finished checked curriculum (its race entries' subsets) is trained from
theta_0 by the curriculum's own trainer, 5 updates and then 5 more on from there (as the sequential race trains an
arm, with its seeds), once at the curriculum's batch and once at half of it. Every checkpoint, and theta_0, is read
on every prompt of the validation sets at ``--draws`` draws on one stream (the check's ``ValidationSample``).

    python benchmarks/half_batch_progress.py --work lists=DEMO_DIR ... [--method checked_raceread] --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cmdline import command_line  # noqa: E402
from common import emit  # noqa: E402

from cropi.data.readers import load_prompts  # noqa: E402
from cropi.pipeline.curriculum import check as chk  # noqa: E402
from cropi.pipeline.curriculum.parts import _RACE_ON, _part_seed  # noqa: E402
from cropi.trainers import make_trainer  # noqa: E402

HALVES = (5, 5)  # the sequential race's two halves of the demo's 10-step part


def run_arms(run: Path, draws: int, scratch: Path) -> dict:
    """One curriculum's stage-0 race arms, trained again at the whole and at half the batch, and read."""
    state = json.loads((run / "state.json").read_text())
    config, record = state["config"], state["stages"][0]["check"]
    sets = {name: load_prompts(path) for name, path in config["validation"].items()}
    sample = chk.ValidationSample.beside(sets, None, config["seed"], draws)
    opts = config["trainer_options"]
    sampling = {"reward": config["reward"], "temperature": opts.get("temperature", 1.0),
                "max_new_tokens": opts["max_new_tokens"]}
    read = lambda ckpt: float(chk.objective(sample.measure(ckpt, **sampling)[0]))  # noqa: E731
    base = read(config["model"])
    arms = record["plan"]["arms"]
    out = {"theta0": base, "arms": {}}
    for batch in (opts["batch_prompts"], opts["batch_prompts"] // 2):
        trainer = make_trainer(config["trainer"], **(opts | {"batch_prompts": batch, "eval_files": {},
                                                             "stage_eval_files": {}}))
        for entry in record["race"]:
            arm = entry["arm"]
            model, gains = config["model"], []
            for leg, steps in enumerate(HALVES):
                seed = _part_seed(config["seed"], 0, 0 if leg == 0 else _RACE_ON, arms.index(arm))
                result = trainer.train_stage(model=model, subset=entry["subset"], out_dir=str(
                    scratch / f"{run.name}-{arm}-{batch}-{leg}"), steps=steps, seed=seed, stage=0,
                    reward=config["reward"])
                model = result.checkpoint
                gains.append(read(model) - base)
            out["arms"].setdefault(arm, {})[str(batch)] = {"gain_5": gains[0], "gain_10": gains[1]}
    return out


def summarize(runs: dict) -> dict:
    """Per task and over all: mean gains at each batch after 5 and 10 updates, half / whole, the order's agreement."""
    tasks: dict = {}
    for key, run in runs.items():
        tasks.setdefault(key.split("/")[0], []).append(run)
    out = {}
    for task, items in [*tasks.items(), ("all", [r for rs in tasks.values() for r in rs])]:
        whole = str(max(int(b) for b in next(iter(items[0]["arms"].values()))))
        half = str(int(whole) // 2)
        row = {}
        for n in ("gain_5", "gain_10"):
            w = float(np.mean([a[whole][n] for r in items for a in r["arms"].values()]))
            h = float(np.mean([a[half][n] for r in items for a in r["arms"].values()]))
            row[n] = {"whole": round(w, 4), "half": round(h, 4), "half_over_whole": round(h / w, 3) if w else None}
        agree = 0
        for r in items:
            a, b = list(r["arms"].values())
            agree += np.sign(a[whole]["gain_5"] - b[whole]["gain_5"]) == np.sign(a[half]["gain_5"] - b[half]["gain_5"])
        row["order_agrees"] = f"{int(agree)} of {len(items)}"
        out[task] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", action="append", required=True, help="TASK=DEMO_DIR (a demo folder with checked runs)")
    ap.add_argument("--method", default="checked")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = {"command": command_line("benchmarks/half_batch_progress.py"), "halves": list(HALVES),
              "draws": args.draws, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for item in args.work:
            task, _, folder = item.partition("=")
            for run in sorted((Path(folder) / "runs" / "curricula").glob(f"{args.method}-seed*")):
                result["runs"][f"{task}/{run.name}"] = r = run_arms(run, args.draws, Path(tmp))
                print(task, run.name, json.dumps(r["arms"]), flush=True)
    result["summary"] = summarize(result["runs"])
    emit(args.out, "half_batch_progress.json", result, "summary")


if __name__ == "__main__":
    main()
