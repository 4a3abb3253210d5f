"""One job attempt in its own process: ``python -m <package>.jobs.worker --root R --job ID --attempt N``.

The worker finds the job's function (a built-in kind, or a ``module:function`` target), calls it as
``fn(params, root=..., progress=...)`` and writes progress and the final state to the job
table. It dies with its runner (Linux parent-death signal, plus a watchdog elsewhere) and
takes its own process group down with it, so nothing it started (vLLM engines, ...) is left
behind. A per-job file lock makes a restarted attempt wait until any leftover one is gone.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from cropi.errors import CropiError, storage_full
from cropi.utils.processes import die_with_parent, kill_group
from .table import JobStore

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5
EXIT_SUPERSEDED = 3

JobFunction = Callable[..., dict[str, Any]]


BUILTIN_TARGET = "builtin"


def resolve_target(kind: str, target: str) -> JobFunction:
    """A built-in kind's function, or the function named ``module:function``."""
    if target == BUILTIN_TARGET:
        from .kinds import BUILTIN  # the library's heavy parts: imported by workers only

        if kind not in BUILTIN:
            raise ValueError(f"no built-in job kind {kind!r}; built-in: {sorted(BUILTIN)}")
        return BUILTIN[kind]
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"job target {target!r} must read 'module:function'")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"job target {target!r}: {module} has no function {name!r}")
    return fn


class ProgressWriter:
    """The progress callback handed to job functions: throttled writes to the job row.

    When the row says this attempt no longer owns the job (cancelled or requeued), the
    worker stops at once: the job functions are resumable, so stopping anywhere is safe.
    """

    def __init__(self, jobs: JobStore, job_id: str, attempt: int, on_superseded: Callable[[], None]):
        self.jobs, self.job_id, self.attempt = jobs, job_id, attempt
        self.on_superseded = on_superseded
        self.last_stage: str | None = None
        self.last_write = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        boundary = stage != self.last_stage or done >= total or done == 0
        if not boundary and now - self.last_write < PROGRESS_EVERY_S:
            return
        self.last_stage, self.last_write = stage, now
        if not self.jobs.report(self.job_id, self.attempt, stage, done, total):
            log.warning("job %s attempt %d superseded; stopping", self.job_id, self.attempt)
            self.on_superseded()


class JobSuperseded(BaseException):
    """This attempt no longer owns its job. A BaseException so job code's ``except Exception`` lets it pass."""


def _raise_superseded() -> None:
    raise JobSuperseded()


def error_payload(exc: BaseException) -> dict[str, str]:
    """The ``{code, message}`` stored for a failed job."""
    exc = storage_full(exc) or exc  # a full device's OSError, wherever in the job it was raised
    if isinstance(exc, CropiError):
        return {"code": exc.code, "message": str(exc)}
    return {"code": "job_error", "message": f"{type(exc).__name__}: {exc} (the worker log under "
                                            "<root>/service/logs has the traceback)"}


def execute_job(root: Path, job_id: str, attempt: int, *,
                on_superseded: Callable[[], None] = _raise_superseded) -> int:
    """Run one attempt of a job to its end; returns the process exit code to use.

    ``on_superseded`` is called when a progress write finds the job cancelled or requeued;
    the default raises ``JobSuperseded`` (caught here), a worker process kills its group instead.
    """
    root = Path(root)
    jobs = JobStore(root / "service" / "jobs.sqlite")
    with _job_lock(root, job_id):
        job = jobs.get(job_id)
        if job.state != "running" or job.attempts != attempt:
            log.info("job %s attempt %d no longer current (%s, attempt %d)", job_id, attempt, job.state, job.attempts)
            return EXIT_SUPERSEDED
        log.info("job %s (%s) attempt %d starting", job_id, job.kind, attempt)
        try:
            fn = resolve_target(job.kind, job.target)
            result = fn(job.params, root=str(root), progress=ProgressWriter(jobs, job_id, attempt, on_superseded))
        except JobSuperseded:
            return EXIT_SUPERSEDED
        except Exception as exc:  # a job failure is data for the caller, not a worker crash
            traceback.print_exc()
            jobs.finish(job_id, attempt, "failed", error=error_payload(exc))
            return 1
        jobs.finish(job_id, attempt, "succeeded", result=result if isinstance(result, dict) else {"value": result})
        log.info("job %s attempt %d succeeded", job_id, attempt)
        return 0


class _job_lock:
    """An exclusive flock on ``<root>/service/locks/<job>.lock`` (blocks while an older attempt lives)."""

    def __init__(self, root: Path, job_id: str):
        self.path = root / "service" / "locks" / f"{job_id}.lock"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the lock


def main(argv: list[str] | None = None) -> int:
    """Entry point of the worker process the runner starts."""
    p = argparse.ArgumentParser(prog=f"python -m {__package__}.worker", description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--job", required=True)
    p.add_argument("--attempt", required=True, type=int)
    p.add_argument("--parent", type=int, default=None, help="runner pid: die when it dies")
    a = p.parse_args(argv)
    from ..base.logs import configure_logging

    configure_logging()
    if a.parent is not None:
        die_with_parent(a.parent)
    return execute_job(a.root, a.job, a.attempt, on_superseded=kill_group)


if __name__ == "__main__":
    raise SystemExit(main())
