"""Spread a shardable job over Ray workers: worker i of N takes shard (i, N).

All workers write to one store (a shared filesystem path or a pyarrow URI); each
commits under its own writer id, so no locks are needed and a rerun resumes.
Works the same on a laptop (``address="local"`` starts a local Ray) and a cluster
(``address="auto"`` or ``ray://host:10001``).

On a cluster a task does not run in the driver's working folder, so local paths
in the job are made absolute before it is shipped (the folder must then be one
every node sees: a shared filesystem, or a pyarrow URI which is left as is).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from cropi.errors import InvalidInputError
from cropi.pipeline.progress import Progress, report

# Job fields that name something on disk. Inputs are made absolute when they exist
# here (a name that does not, like a Hub model id, is left alone); outputs always.
INPUT_PATHS = ("model", "prompts", "trajectories")
OUTPUT_PATHS = ("out", "store")


class RayPlacement(BaseModel):
    """Where a shardable job's shards run: the one spelling of these settings and their defaults, read by
    the CLI's flags (``--ray``, ``--workers``, ``--gpus-per-worker``) and by job files (``"ray": {...}``)."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field("local", description="Ray cluster address; 'local' starts Ray here")
    workers: int = Field(2, ge=1, le=4096, description="Ray workers, one shard each")
    gpus_per_worker: Union[Literal["auto"], Annotated[float, Field(ge=0)]] = Field(
        "auto", description="GPUs per Ray worker ('auto': 1 when the cluster has GPUs, else 0)")

    def gpus(self, resources: dict) -> float:
        """GPUs each worker asks for on a cluster with ``resources`` (``ray.cluster_resources()``)."""
        return default_gpus(resources) if self.gpus_per_worker == "auto" else float(self.gpus_per_worker)


def run_sharded(fn: Callable[[BaseModel], dict], job: BaseModel, placement: Optional[RayPlacement] = None, *,
                cpus_per_worker: float = 1.0, progress: Progress | None = None) -> list[dict]:
    """Run ``fn(job with shard=(i, workers))`` for every i as Ray tasks; results in shard order.

    ``placement`` (default: ``RayPlacement()``) names the cluster, the workers and their GPUs. A
    worker with no GPU sees none (``CUDA_VISIBLE_DEVICES=""``): Ray leaves the variable unset for
    such tasks, and torch would then put every one of them on GPU 0.
    ``progress`` hears ``("workers", done, total)`` as shards finish.
    """
    placement = placement or RayPlacement()
    workers, address = placement.workers, placement.address
    progress = report(progress)
    try:
        import ray
    except ImportError:
        raise InvalidInputError("Ray is not installed: pip install 'cropi[ray]'") from None
    job = absolute_paths(job)
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    try:
        gpus = placement.gpus(ray.cluster_resources())
        env = {} if gpus else {"CUDA_VISIBLE_DEVICES": ""}
        task = ray.remote(num_gpus=gpus, num_cpus=cpus_per_worker, max_retries=2,
                          runtime_env={"env_vars": env} if env else None)(_call)
        refs = [task.remote(fn, job.model_copy(update={"shard": (i, workers)}), bool(gpus)) for i in range(workers)]
        pending, done = list(refs), 0
        progress("workers", 0, workers)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            ray.get(finished)  # a failed shard raises here, not after the others finish
            done += len(finished)
            progress("workers", done, workers)
        return ray.get(refs)
    finally:
        if started:
            ray.shutdown()


def default_gpus(resources: dict) -> float:
    """One GPU a worker when the cluster has any, else none."""
    return 1.0 if resources.get("GPU", 0) > 0 else 0.0


def absolute_paths(job: BaseModel) -> BaseModel:
    """``job`` with its local paths absolute (URIs and names not on disk unchanged)."""
    update = {}
    for name in INPUT_PATHS + OUTPUT_PATHS:
        value = getattr(job, name, None)
        if not isinstance(value, str) or "://" in value:
            continue
        path = Path(value).expanduser()
        if name in OUTPUT_PATHS or path.exists():
            update[name] = str(path.resolve())
    return job.model_copy(update=update)


def _call(fn, job, uses_gpu: bool):
    # Ray retries a task whose worker died; the job resumes from what that worker committed.
    if not uses_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything in this task touches CUDA
    return fn(job)
