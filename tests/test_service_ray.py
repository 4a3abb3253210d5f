"""Jobs submitted as Ray tasks (a local Ray cluster): they run, report progress and can be cancelled.

Slow (starting Ray takes tens of seconds on 2 cores); skipped without ray.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


from cropi_service.jobs.table import JobStore
from cropi_service.jobs.runner import RayLauncher, Runner
from cropi_service.base.settings import ServiceSettings
from support import service_jobs
from support.service import wait_until

JOBS = service_jobs.__name__


def test_jobs_run_and_cancel_as_ray_tasks(tmp_path, monkeypatch):
    # the Ray workers inherit the environment of the cluster started here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    settings = ServiceSettings(root=tmp_path / "root", ray_address="local", workers=2, poll_s=0.1)
    jobs = JobStore(settings.db_path)
    runner = Runner(settings, jobs)
    try:
        runner.start()
        assert isinstance(runner.launcher, RayLauncher)
        work = tmp_path / "work"
        steps = jobs.create("steps", f"{JOBS}:steps_job", {"dir": str(work), "steps": 3, "sleep": 0.05})
        wait = jobs.create("wait", f"{JOBS}:wait_job", {"name": "never", "timeout": 120})
        wait_until(lambda: jobs.get(steps.id).state == "succeeded", 120, "the Ray steps job")
        assert jobs.get(steps.id).progress == {"stage": "steps", "done": 3, "total": 3}
        wait_until(lambda: jobs.get(wait.id).progress is not None, 60, "the Ray wait job to report")
        jobs.cancel(wait.id)
        wait_until(lambda: wait.id not in runner.running, 60, "the cancelled Ray task to end")
        assert jobs.get(wait.id).state == "cancelled"
    finally:
        runner.stop()
        ray.shutdown()
