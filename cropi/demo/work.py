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


def init_worker(threads: int = 1) -> None:
    """One torch thread per process (the tiny model gains nothing from more), quiet libraries."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def run_collect(job: dict, shard: tuple[int, int]) -> dict:
    """One shard of a collect job."""
    from cropi.pipeline.collect import CollectJob, collect

    job = CollectJob.model_validate({**job, "shard": shard})
    return collect(job, LogProgress(f"shard {shard[0]}/{shard[1]} "))


def run_gradients(job: dict, shard: tuple[int, int]) -> dict:
    """One shard of a gradients job."""
    from cropi.pipeline.gradients import GradientJob, compute_gradients

    job = GradientJob.model_validate({**job, "shard": shard})
    return compute_gradients(job, LogProgress(f"shard {shard[0]}/{shard[1]} "))


def run_eval(model: str, test: str, reward: str, max_new_tokens: int) -> dict:
    """Greedy test accuracy of a checkpoint, cached beside it (keyed by its fingerprint and the test set)."""
    from cropi.data import load_prompts, prompts_fingerprint
    from cropi.demo.evaluate import evaluate
    from cropi.utils.fingerprint import model_fingerprint

    records = load_prompts(test)
    key = {"model": model_fingerprint(model), "test": prompts_fingerprint(records), "reward": reward,
           "max_new_tokens": max_new_tokens}
    cache = Path(model).parent / "test_eval.json"
    if cache.is_file():
        doc = json.loads(cache.read_text())
        if doc.get("key") == key:
            return doc["result"]
    result = evaluate(model, records, reward=reward, max_new_tokens=max_new_tokens)
    result = {"accuracy": result["accuracy"], "n": result["n"], "by_skill": result["by_group"]}
    cache.write_text(json.dumps({"key": key, "result": result}, sort_keys=True) + "\n")
    return result


def run_method(config: dict, root: str, test: str, reward: str, max_new_tokens: int) -> dict:
    """Run one curriculum to its end, then evaluate every stage checkpoint on the test set."""
    from cropi.pipeline.curriculum import CurriculumConfig, run_curriculum

    cfg = CurriculumConfig.model_validate(config)
    started = time.monotonic()
    result = run_curriculum(cfg, root=root, progress=LogProgress(every_s=30.0))
    trained = time.monotonic()
    evals = []
    for stage in result["stages"]:
        evals.append({"step": stage["global_step"], **run_eval(stage["checkpoint"], test, reward, max_new_tokens)})
    say(f"{cfg.name}: done; test accuracy by step " +
        ", ".join(f"{e['step']}: {e['accuracy']:.3f}" for e in evals))
    return {"method": cfg.method, "seed": cfg.seed, "name": cfg.name, "stages": result["stages"], "evals": evals,
            "seconds": {"curriculum": trained - started, "evaluation": time.monotonic() - trained}}
