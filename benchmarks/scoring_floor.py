"""How far a later stage's scoring can fall on `lists`: its parts against the stage's own training, side by side.

Issue 32 asks scoring plus checks to cost at most 0.6 of a stage's training on `lists`. This measures, at each
later stage (1-4) of a finished `make demo` run's checked curriculum (``--work``: its folder), in one process
with the demo's one torch thread, each piece at the stage's own checkpoint, in turn, ``--rounds`` times:

- ``gradients``: the POPI gradients the ranking cannot do without (the pool's mixed groups and both validation
  sets, every response, projected), into a fresh store holding only theta_0's trajectories;
- ``scoring``: the whole score step the curriculum runs (``score_checkpoint`` with the check's refresh), into
  another fresh store;
- ``training``: the stage's training on its own subset (the lean trainer, the demo's options, its test-split
  evaluations left out as the demo's cost figures leave them out).

A stage's best of ``--rounds`` for each piece; the ratios are of sums over the stages. ``gradients / training``
is the floor of scoring's share for any rule that ranks the pool at every stage.

    python benchmarks/scoring_floor.py --work out/demo [--source TEXT] [--curriculum checked-seed0] [--rounds 2] \
        --out benchmarks/results
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402


def measure(work: Path, curriculum: str, rounds: int) -> dict:
    from cropi.models.warmstart import set_threads
    from cropi.pipeline.compute_gradients import compute_gradients
    from cropi.pipeline.curriculum.config import CurriculumConfig
    from cropi.pipeline.curriculum.state import load_state
    from cropi.pipeline.score import ensure_trajectories, gradient_jobs, score_checkpoint
    from cropi.trainers import make_trainer

    set_threads(1)  # the demo's workers run one torch thread each
    runs = work / "runs"
    doc = load_state(runs, curriculum)
    config = CurriculumConfig.model_validate(doc["config"])
    options = {k: v for k, v in config.trainer_options.items() if k not in ("eval_files", "stage_eval_files")}
    trainer = make_trainer(config.trainer, **options)
    behavior = str(Path(config.model).resolve())
    stages = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for stage in doc["stages"][1:]:
                m, model = stage["index"], stage["scored"]["model"]
                request = config.score_request(model, behavior)
                row = stages.setdefault(m, {"gradients": [], "scoring": [], "training": []})
                fresh = Path(tmp) / f"g{r}-{m}"
                shutil.copytree(runs / "trajectories", fresh / "trajectories")
                trajectories = ensure_trajectories(request, fresh, lambda *a: None)
                began = time.perf_counter()
                for job in gradient_jobs(request, fresh, trajectories):
                    compute_gradients(job, lambda *a: None)
                row["gradients"].append(time.perf_counter() - began)
                fresh = Path(tmp) / f"s{r}-{m}"
                shutil.copytree(runs / "trajectories", fresh / "trajectories")
                began = time.perf_counter()
                score_checkpoint(request, root=fresh, refresh=config.stage_refresh)
                row["scoring"].append(time.perf_counter() - began)
                trained = trainer.train_stage(model=model, subset=stage["selected"]["subset"],
                                              out_dir=str(Path(tmp) / f"t{r}-{m}"), steps=config.steps_per_stage,
                                              seed=config.seed, stage=m, reward=config.reward)
                row["training"].append(trained.metrics["runtime_s"])  # the trainer's clock, as the demo reads it
                print(f"round {r} stage {m}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in row.items()), flush=True)
    best = {m: {k: round(min(v), 3) for k, v in row.items()} for m, row in stages.items()}
    total = {k: sum(b[k] for b in best.values()) for k in ("gradients", "scoring", "training")}
    return {"stages": best, "all_rounds": stages, "total_s": total,
            "gradients_over_training": round(total["gradients"] / total["training"], 3),
            "scoring_over_training": round(total["scoring"] / total["training"], 3)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path, help="a finished `make demo` folder (OUT/demo)")
    ap.add_argument("--source", default="a make demo folder",
                    help="what --work is, as a reader elsewhere can find it (its path is this machine's: not recorded)")
    ap.add_argument("--curriculum", default="checked-seed0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    a = ap.parse_args(argv)
    result = {"benchmark": "scoring_floor", "source": a.source, "curriculum": a.curriculum, "rounds": a.rounds,
              "goal": "scoring + checks <= 0.6 x a stage's training on lists (issue 32)",
              **measure(a.work, a.curriculum, a.rounds), "environment": environment()}
    write_json(a.out, "scoring_floor.json", result)
    print({k: result[k] for k in ("total_s", "gradients_over_training", "scoring_over_training")})
    return result


if __name__ == "__main__":
    main()
