"""What the demo's worker processes run: collection and gradient shards, evaluations,
and one (method, seed) curriculum followed by the evaluation of its stage checkpoints.

Every function takes and returns plain data, so it crosses a process boundary.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cropi.demo.log import LogProgress, say


def init_worker(parent: int | None = None, task: str | None = None) -> None:
    """The demo's thread policy in this process, quiet libraries, and the libraries every task imports;
    in a pool's worker (``parent``: the demo's process id) an exit once that process is gone, and the ``task``'s
    own module imported: a task defined outside the package may register its reward there (``register_reward``),
    and a spawned worker knows only what it imports.

    Every demo phase (collection, scoring, training, evaluation) runs at the one thread count every
    model build runs at (``cropi.models.warmstart.TORCH_THREADS``), in a worker process or inline
    alike, so one worker or two and any machine core count give the same numbers: a float32
    reduction split over more threads adds in another order. The imports (9 s for the demo's two
    processes on 2 idle cores, benchmarks/results/demo/idle/phases.json) are made here, timed as the demo's
    ``workers`` phase, rather than inside the first task: there they were charged to theta_0's collection,
    that is to the scoring of every ranking method."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if parent is not None:
        from cropi.utils.processes import die_with_parent

        die_with_parent(parent)  # a demo killed alone takes its workers with it
    import transformers

    from cropi.models.warmstart import TORCH_THREADS, set_threads

    set_threads(TORCH_THREADS)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - resolved lazily otherwise
    # Resolved lazily too, on a process's first model load or t quantile: 1.1 s and 0.6 s a process, charged
    # (x workers) to theta_0's collection and to the first check until imported here. The demo's models are
    # Qwen2 (cropi.models.tiny).
    import scipy.stats  # noqa: F401
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    import cropi.pipeline.collect  # noqa: F401
    import cropi.pipeline.compute_gradients  # noqa: F401
    import cropi.pipeline.curriculum  # noqa: F401

    if task is not None:
        from cropi.tasks.base import load_task

        load_task(task)


def ready() -> int:
    """A started worker's process id (``init_worker`` has run in it)."""
    time.sleep(0.2)  # long enough that a pool's other starting processes take their share of the tasks
    return os.getpid()


def run_collect(job: dict, shard: tuple[int, int]) -> dict:
    """One shard of a collect job."""
    from cropi.pipeline.collect import CollectJob, collect

    job = CollectJob.model_validate({**job, "shard": shard})
    return collect(job, LogProgress(f"shard {shard[0]}/{shard[1]} "))


def run_gradients(job: dict, shard: tuple[int, int]) -> dict:
    """One shard of a gradients job."""
    from cropi.pipeline.compute_gradients import GradientJob, compute_gradients

    job = GradientJob.model_validate({**job, "shard": shard})
    return compute_gradients(job, LogProgress(f"shard {shard[0]}/{shard[1]} "))


def run_method(config: dict, root: str) -> dict:
    """Run one curriculum to its end; returns its stages and the test evaluations its trainer logged."""
    from cropi.pipeline.curriculum import CurriculumConfig, run_curriculum
    from cropi.pipeline.curriculum.state import CurriculumPaths

    cfg = CurriculumConfig.model_validate(config)
    started = time.monotonic()
    result = run_curriculum(cfg, root=root, progress=LogProgress(every_s=30.0))
    evals, steps = [], []
    for stage in result["stages"]:
        rows = [json.loads(line) for line in Path(stage["metrics_path"]).read_text().splitlines() if line]
        evals += [r for r in rows if "eval" in r]
        steps += [r for r in rows if "eval" not in r]
        _backfill_evaluation(stage, CurriculumPaths(root, cfg.name).stage(stage["index"]))
    say(f"{cfg.name}: done in {time.monotonic() - started:.0f}s")
    return {"method": cfg.method, "selection": cfg.method, "seed": cfg.seed, "name": cfg.name, "stages": result["stages"],
            "evals": evals, "steps": steps, "seconds": time.monotonic() - started,
            "pool_ess": pool_ess(cfg, root)}


def _backfill_evaluation(stage: dict, folder: Path) -> None:
    """A stage trained before the trainer reported its test-split evaluations apart (``eval_s``): take them out
    of its training seconds here, from the evaluation rows of every part it trained (each ``train/metrics.jsonl``
    under the stage's folder: a reverted part and the race's loser included, as its training seconds are)."""
    cost = stage.get("cost_s")
    if not cost or "eval_s" in (stage.get("metrics") or {}) or not stage.get("checkpoint"):
        return
    seconds = sum(json.loads(line).get("eval_s", 0.0) for log in sorted(folder.glob("**/train/metrics.jsonl"))
                  for line in log.read_text().splitlines() if line)
    cost["training"], cost["evaluation"] = round(cost["training"] - seconds, 3), round(seconds, 3)


def pool_ess(cfg, root: str) -> dict[str, list[float]]:
    """Stage -> the ESS/K of every pool prompt (informative or not) at the checkpoint the stage was scored at:
    how far theta_m has moved from the trajectories it reuses (1 at the behavior policy)."""
    from cropi.contracts import POOL
    from cropi.pipeline.curriculum.state import CurriculumPaths
    from cropi.store import GradientStore

    paths = CurriculumPaths(root, cfg.name)
    stages = json.loads(paths.state.read_text())["stages"]
    out = {}
    for stage in stages:
        scored = stage.get("scored", {})
        if scored.get("checkpoint") and scored.get("spec_id"):
            table = GradientStore(paths.store).open_split(scored["checkpoint"], scored["spec_id"], POOL).read()
            if table.ess_fraction is not None:
                out[str(stage["index"])] = [float(v) for v in table.ess_fraction if v == v]  # NaN: unknown
    return out
