"""The lean GRPO trainer at an old revision against the working tree, side by side: has a step got slower?

The real situation: the demo's shipped warm start, the lists pool, the demo's trainer settings
(``DemoSettings``; the test-split evaluations left out, since they are the demo's measurement) and the
real reward. Each side trains ``--steps`` steps from the warm start in a process of its own, one torch
thread, after a 2-step warm-up that takes the imports and first-call costs off the clock; the sides
alternate, their order rotating round by round, so load on a shared machine hits both alike. Both sides
must log the same metrics (the same seeds, the same updates): a speed-up that changed the training is
not one.

    python benchmarks/trainer_revisions.py [--baseline REV] [--rounds 2] [--steps 40] --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402
from sides import REPO, alternate, run_side  # noqa: E402

DEFAULT_BASELINE = "10bfc7c"  # main at the end of issue 25, whose demo quoted a GRPO step at 0.12 s


def child(options: dict, reward: str, steps: int, scratch: Path) -> dict:
    """Seconds and metrics of ``steps`` lean steps on the lists pool from the shipped warm start."""
    import torch

    torch.set_num_threads(1)
    import cropi
    from cropi.data import write_verl_parquet
    from cropi.demo.assets import shipped_model, task_splits
    from cropi.trainers import make_trainer

    subset = scratch / "pool.parquet"
    write_verl_parquet(task_splits()["pool"], str(subset))
    trainer = make_trainer("lean", **options)
    run = dict(model=str(shipped_model()), subset=str(subset), seed=0, stage=0, reward=reward)
    trainer.train_stage(out_dir=str(scratch / "warm"), steps=2, **run)
    began = time.perf_counter()
    result = trainer.train_stage(out_dir=str(scratch / "run"), steps=steps, **run)
    seconds = time.perf_counter() - began
    side_root = Path(os.environ["PYTHONPATH"]).resolve()
    return {"seconds": seconds, "seconds_per_step": seconds / steps,
            "metrics": {k: v for k, v in result.metrics.items() if k in ("reward_first", "reward_last", "reward_mean",
                                                                          "zero_advantage_share", "loss_last")},
            "cropi_from": str(Path(cropi.__file__).resolve().parent.relative_to(side_root))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the old side")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--options", help=argparse.SUPPRESS)
    p.add_argument("--reward", help=argparse.SUPPRESS)
    p.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.options), a.reward, a.steps, a.scratch)))
        return 0
    from cropi.demo.settings import DemoSettings

    settings = DemoSettings().resolved()  # lists, with its response length and reward
    options = {k: v for k, v in settings.trainer_options({}).items()
               if k not in ("eval_files", "eval_every", "eval_samples", "stage_eval_files")}
    runs = alternate(a.baseline, a.rounds,
                     lambda code, scratch: run_side(code, __file__, ["--child", "--options", json.dumps(options),
                                                                     "--reward", settings.reward, "--steps",
                                                                     str(a.steps), "--scratch", str(scratch)]),
                     lambda run: f"{run['seconds_per_step']:.3f} s a step")
    best = {name: min(run["seconds_per_step"] for run in rs) for name, rs in runs.items()}
    same = all(run["metrics"] == runs["baseline"][0]["metrics"] for rs in runs.values() for run in rs)
    payload = {"command": f"python benchmarks/trainer_revisions.py --baseline {a.baseline} --rounds {a.rounds} "
                          f"--steps {a.steps}",
               "baseline": a.baseline, "options": options, "reward": settings.reward, "steps": a.steps,
               "best_seconds_per_step": best, "working_tree_over_baseline": best["working_tree"] / best["baseline"],
               "metrics_equal": same, "runs": runs, "environment": environment()}
    path = write_json(a.out, "trainer_revisions.json", payload)
    print(f"working tree / baseline: {payload['working_tree_over_baseline']:.3f} a step (best of {a.rounds}); "
          f"metrics equal: {same}; {path}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
