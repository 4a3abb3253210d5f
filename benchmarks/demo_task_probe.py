"""Choose a demo task's targets from full-pool training alone (docs/demo.md, design criterion 2).

One full-pool GRPO run (the demo's trainer and settings, seed 0) from the task's shipped
warm start, evaluated on every skill's test split; the targets are the two skills in range
at the warm start's stopping snapshot (benchmarks/results/demo/warmstart_scan.json) with
the largest sampled gain at the end (mean of the last 3 evaluations minus step 0). CROPI
is not run.

    python benchmarks/demo_task_probe.py --task lists --scan benchmarks/results/demo/warmstart_scan.json \
        --out benchmarks/results/demo/task_probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cropi.data import write_jsonl
from cropi.demo.assets import place_model, task_splits
from cropi.demo.settings import DemoSettings
from cropi.demo.work import init_worker, run_method
from cropi.pipeline.curriculum import CurriculumConfig


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="lists")
    p.add_argument("--scan", required=True, help="the warm start's scan JSON (its last snapshot's in-range skills)")
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a demo setting other than its default (lr, stages, kl_coef, batch_prompts, ...)")
    a = p.parse_args(argv)
    init_worker()  # the demo's thread policy, as in `cropi demo`'s workers: the same model and numbers
    scan = json.loads(Path(a.scan).read_text())
    in_range = scan["snapshots"][-1]["qualifying"]
    given = dict(item.split("=", 1) for item in a.set)
    settings = DemoSettings(task=a.task, methods=("cropi", "full"), **given).resolved()
    task = settings.load_task()
    splits = task_splits(task)
    tests = [s for s in in_range]  # the targets are chosen among these
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name in ["pool", *tests]:
            files[name] = str(Path(tmp) / f"{name}.jsonl")
            write_jsonl(splits[name][:settings.pool_size if name == "pool" else settings.test_size], files[name])
        model = str(place_model(Path(tmp) / "theta0", task))
        options = settings.trainer_options({t: files[t] for t in tests})
        config = CurriculumConfig(name="probe-full", model=model, pool=files["pool"], stages=settings.stages,
                                  steps_per_stage=settings.steps_per_stage, method="full", trainer="lean",
                                  trainer_options=options, seed=0, reward=settings.reward, device="cpu")
        run = run_method(config.model_dump(mode="json"), str(Path(tmp) / "runs"))
    k = settings.eval_samples
    curves = {t: {row["step"]: row["eval"][t][f"mean@{k}"] for row in run["evals"]} for t in tests}
    gains = {}
    for t, c in curves.items():
        steps = sorted(c)
        gains[t] = float(np.mean([c[s] for s in steps[-3:]]) - c[steps[0]])
    ranked = sorted((t for t in in_range if t in gains), key=lambda t: -gains[t])
    report = {"task": task.name, "rule": "the two in-range skills of the warm start's stopping snapshot with the "
              "largest full-pool sampled gain (mean of the last 3 evaluations minus step 0)",
              "in_range_at_warm_start": in_range, "gain": gains, "targets": ranked[:2],
              "curves": {t: {str(s): v for s, v in sorted(c.items())} for t, c in curves.items()},
              "settings": settings.model_dump(mode="json"), "seconds": round(time.monotonic() - started, 1)}
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"gain": gains, "targets": ranked[:2]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
