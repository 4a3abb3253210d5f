"""Chaos: the server and the worker killed at random points, several times in one scoring job.

The job completes, and its stored ranking is bitwise equal to an uninterrupted run's (the
``reference`` fixture: the library's own scoring of the same inputs, in one go).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest


from cropi.pipeline.rank import load_ranking
from cropi.selection import DEFAULT_SELECTOR
from cropi.store import GradientStore
from cropi.contracts import POOL
from cropi.pipeline.requests import store_path
from support.service_e2e import world, reference, Server, _worker_pid, finished, gone, submit_scoring

KILLS = 4
SEED = int(os.environ.get("CROPI_CHAOS_SEED", "12"))


@pytest.mark.slow
def test_random_kills_of_server_and_worker_leave_the_ranking_bitwise_equal(world, reference, tmp_path):
    rng = random.Random(SEED)
    server = Server(tmp_path / "root", world["data"], tmp_path / "server.log")
    server.start()
    kills: list[tuple[str, str]] = []
    try:
        with server.client() as c:
            _, job_id = submit_scoring(c, world)
        worker_kills = 0
        for _ in range(KILLS):
            # a random moment once the worker runs (it takes a few seconds to import the library)
            deadline = time.monotonic() + 120
            while not _worker_pid(server.root, job_id) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.5, 4.0))
            with server.client() as c:
                job = c.get(f"/v1/jobs/{job_id}").json()
            if job["state"] not in ("queued", "running"):
                break
            stage = (job.get("progress") or {}).get("stage", "starting")
            pid = _worker_pid(server.root, job_id)
            # the worker alone (as the OOM killer would) at most max_attempts - 1 times
            if pid and worker_kills < 2 and rng.random() < 0.5:
                os.kill(pid, signal.SIGKILL)
                worker_kills += 1
                kills.append(("worker", stage))
            else:
                server.kill()
                kills.append(("server", stage))
                gone(pid)
                server.start()
        with server.client() as c:
            job = finished(c, job_id)
        assert job["state"] == "succeeded", (job, kills)
        assert len(kills) >= 2, f"the job ended before it was killed twice: {kills}"
    finally:
        server.stop()
    got = load_ranking(store_path(server.root), "ck", spec_id=reference["spec_id"], selector=DEFAULT_SELECTOR)
    want = reference["ranking"]
    assert got.table.equals(want.table), kills  # bitwise: every column, every value
    assert got.excluded == want.excluded
    pool = GradientStore(store_path(server.root)).open_split("ck", reference["spec_id"], POOL).read()
    order = [pool.prompt_ids.index(p) for p in reference["pool"].prompt_ids]
    assert pool.vectors[order].tobytes() == reference["pool"].vectors.tobytes()
