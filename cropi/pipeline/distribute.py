"""Spread a shardable job over Ray workers: worker i of N takes shard (i, N).

All workers write to one store (a shared filesystem path or a pyarrow URI); each
commits under its own writer id, so no locks are needed and a rerun resumes.
Works the same on a laptop (``address="local"`` starts a local Ray) and a cluster.
"""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel

from cropi.errors import InvalidInputError


def run_sharded(fn: Callable[[BaseModel], dict], job: BaseModel, *, workers: int, address: str = "local",
                gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0) -> list[dict]:
    """Run ``fn(job with shard=(i, workers))`` for every i as Ray tasks; results in shard order."""
    if workers < 1:
        raise InvalidInputError(f"workers must be at least 1, got {workers}")
    try:
        import ray
    except ImportError:
        raise InvalidInputError("Ray is not installed: pip install 'cropi[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    try:
        task = ray.remote(num_gpus=gpus_per_worker, num_cpus=cpus_per_worker, max_retries=2)(_call)
        refs = [task.remote(fn, job.model_copy(update={"shard": (i, workers)})) for i in range(workers)]
        return ray.get(refs)
    finally:
        if started:
            ray.shutdown()


def _call(fn, job):
    # Ray retries a task whose worker died; the job resumes from what that worker committed.
    return fn(job)
