"""The Ray path against a Ray cluster started on its own (``ray start --head``), as on a
real cluster: the driver connects by address, from a working folder that is not the
one the tasks run in, with relative paths on the command line.

The cluster is this test's: its own temp dir and port, stopped at the end by killing
the process group it was started in (never ``ray stop``, which would stop any Ray on
the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CLI = "import sys; from cropi.cli import main; sys.exit(main(sys.argv[1:]))"


_HOME = tempfile.mkdtemp(prefix="cropi-ray-home-")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    # Auth off, explicitly, and its own HOME: an in-process ray.init() earlier in this pytest run
    # sets RAY_AUTH_MODE=token in os.environ, and a ~/.ray/auth_token another Ray user left would
    # switch the cluster to token auth as well (both seen in CI).
    return dict(os.environ, PYTHONPATH=path, RAY_USAGE_STATS_ENABLED="0", HOME=_HOME, RAY_AUTH_MODE="disabled")


@pytest.fixture(scope="module")
def cluster():
    temp = tempfile.mkdtemp(prefix="/tmp/rc")  # short: Ray's socket paths have a length limit
    port = _free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={port}", f"--temp-dir={temp}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats"],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not list(Path(temp).glob("session_*/logs/raylet.out")):
            assert head.poll() is None, head.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the Ray head did not start in 60 s"
            time.sleep(0.5)
        time.sleep(2)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_collect_on_a_separate_cluster_from_another_folder(cluster, tmp_path):
    from cropi.data.writers import write_jsonl
    from cropi.models import build_tiny_model
    from cropi.store import TrajectoryStore
    from cropi.tasks.arithmetic import make_task_splits

    work = tmp_path / "work"
    (work / "inputs").mkdir(parents=True)
    build_tiny_model(work / "inputs" / "model", seed=0)
    records = make_task_splits(seed=0, pool_size=12, val_size=1, test_size=1)["pool"]
    write_jsonl(records, str(work / "inputs" / "prompts.jsonl"))

    proc = subprocess.run([sys.executable, "-c", CLI, "collect", "--model", "inputs/model", "--prompts",
                           "inputs/prompts.jsonl", "--out", "traj", "--backend", "hf", "--samples", "2",
                           "--max-new-tokens", "8", "--ray", cluster, "--workers", "2"],
                          cwd=work, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The store is where the driver's relative path points, not in a task's working folder.
    store = TrajectoryStore.open(str(work / "traj"))
    assert sorted(store.committed_prompt_ids()) == sorted(r.prompt_id for r in records)
    assert {p.name for p in (work / "traj").rglob("commits/*.json")} == {"shard-0000-of-0002.json",
                                                                       "shard-0001-of-0002.json"}
    # Progress under --ray: the shards' bar reached 2 of 2.
    assert "workers" in proc.stderr and "2/2" in proc.stderr


def test_a_worker_without_gpus_sees_none(cluster, monkeypatch):
    from cropi.pipeline.distribute import RayPlacement, run_sharded
    from pydantic import BaseModel

    class Probe(BaseModel):
        shard: tuple[int, int] = (0, 1)

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module
    monkeypatch.setenv("HOME", _HOME)
    ray.init(address=cluster, log_to_driver=False)
    try:
        results = run_sharded(_visible_devices, Probe(), RayPlacement(workers=2, address=cluster))
    finally:
        ray.shutdown()
    assert results == [{"cuda": "", "shard": [0, 2]}, {"cuda": "", "shard": [1, 2]}]


def _visible_devices(job) -> dict:
    return {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "shard": list(job.shard)}
