"""The real service end to end: a scored world (task model, trajectories, reference results)
and a server in a subprocess."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cropi.contracts import POOL
from cropi.data import write_jsonl
from cropi.generation import SamplingConfig
from cropi.pipeline.collect import CollectJob, collect
from cropi.pipeline.rank import load_ranking
from cropi.selection import DEFAULT_SELECTOR
from cropi.projection import ProjectionSpec
from cropi.pipeline.requests import store_path
from cropi.store import GradientStore
from support.service import alive, wait_job


scoring = pytest.importorskip("cropi.pipeline.score")
httpx = pytest.importorskip("httpx")


REPO = Path(__file__).resolve().parents[2]
TOKEN = "e2e-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ARROW = "application/vnd.apache.arrow.stream"
PROJECTION = {"kind": "sjlt", "dim": 256, "kept_fraction": 0.5, "seed": 3}
SPLITS = {"pool": 40, "val_a": 8, "val_b": 8}


@pytest.fixture(scope="module")
def world(task_model, task_splits, tmp_path_factory):
    """Model, prompt files and trajectories under one data root."""
    import shutil

    data = tmp_path_factory.mktemp("e2e") / "data"
    data.mkdir()
    splits = task_splits
    model = data / "model"
    shutil.copytree(task_model, model)  # under the service's data root
    files, trajectories = {}, {}
    for name in SPLITS:
        files[name] = data / f"{name}.jsonl"
        write_jsonl(splits[name], str(files[name]))
        trajectories[name] = data / "trajectories" / name
        sampling = SamplingConfig(samples=8, temperature=1.0, max_new_tokens=32, seed=1)
        collect(CollectJob(model=str(model), prompts=str(files[name]), out=str(trajectories[name]),
                           sampling=sampling, backend="hf"))
    return {"data": data, "model": model, "files": files, "trajectories": trajectories}


@pytest.fixture(scope="module")
def reference(world, tmp_path_factory):
    """The library's own, uninterrupted scoring of the same inputs."""
    root = tmp_path_factory.mktemp("reference")
    request = scoring.ScoreRequest(
        name="ck", model=str(world["model"]), pool=str(world["files"]["pool"]),
        validation={v: str(world["files"][v]) for v in ("val_a", "val_b")},
        trajectories={k: str(v) for k, v in world["trajectories"].items()},
        spec=ProjectionSpec(**PROJECTION))
    scoring.score_checkpoint(request, root=str(root))
    spec_id = ProjectionSpec(**PROJECTION).spec_id
    ranking = load_ranking(store_path(root), "ck", spec_id=spec_id, selector=DEFAULT_SELECTOR)
    pool = GradientStore(store_path(root)).open_split("ck", spec_id, POOL).read()
    return {"ranking": ranking, "pool": pool, "spec_id": spec_id}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m cropi_service serve`` in a subprocess."""

    def __init__(self, root: Path, data: Path, log: Path):
        self.root, self.data, self.log = root, data, log
        self.token_file = root.parent / "token"
        self.token_file.write_text(TOKEN)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "cropi_service", "serve", "--root", str(self.root), "--port", str(self.port),
               "--token-file", str(self.token_file), "--data-root", str(self.data)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"the server did not start; log: {self.log.read_text()[-3000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=AUTH, timeout=60)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def submit_scoring(c: httpx.Client, world: dict) -> tuple[str, str]:
    """The world's prompt sets registered and its checkpoint submitted for scoring: (checkpoint id, job id)."""
    ids = {}
    for name in SPLITS:
        kind = "pool" if name == "pool" else "validation"
        r = c.post("/v1/datasets", json={"name": name, "path": str(world["files"][name]), "kind": kind})
        assert r.status_code == 201, r.text
        assert r.json()["n_prompts"] == SPLITS[name]
        ids[name] = r.json()["id"]
    r = c.post("/v1/checkpoints", json={
        "name": "ck", "path": str(world["model"]), "pool": ids["pool"], "validation": [ids["val_a"], ids["val_b"]],
        "projection": PROJECTION, "trajectories": {k: str(v) for k, v in world["trajectories"].items()}})
    assert r.status_code == 202, r.text
    return r.json()["id"], r.json()["job_id"]


def finished(c: httpx.Client, job_id: str) -> dict:
    """The job's view once it has ended (the real pipeline on 2 cores: minutes)."""
    return wait_job(c.get, job_id, timeout=600, every=0.2)


def gone(pid: int | None, timeout: float = 15.0) -> bool:
    """Whether process ``pid`` (a killed server's worker, which follows its server) is gone within ``timeout``."""
    deadline = time.monotonic() + timeout
    while pid and alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not (pid and alive(pid))


def _worker_pid(root: Path, job_id: str) -> int | None:
    from cropi_service.jobs.table import JobStore

    return JobStore(root / "service" / "jobs.sqlite").get(job_id).pid
