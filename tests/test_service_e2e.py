"""End to end: the real server as a subprocess over the real pipeline, killed mid-job.

A tiny model warm-started on the test's prompts, arithmetic prompt sets and their
trajectories (collected with the transformers backend) are prepared once. The library scores them directly (the
uninterrupted reference run); the service scores the same inputs, is SIGKILLed while the
gradients are being computed, is started again, resumes the job, and must then serve the
reference ranking and the reference vectors, as JSON and as Arrow.

Needs cropi.pipeline.score (skipped without it). Slow: minutes on 2 CPU cores.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytestmark = pytest.mark.slow

scoring = pytest.importorskip("cropi.pipeline.score")
httpx = pytest.importorskip("httpx")

from cropi.data import write_jsonl  # noqa: E402
from cropi.generation import SamplingConfig  # noqa: E402
from cropi.pipeline.collect import CollectJob, collect  # noqa: E402
from cropi.pipeline.rank import load_ranking  # noqa: E402
from cropi.projection import ProjectionSpec  # noqa: E402
from cropi.store import GradientStore  # noqa: E402
from cropi.contracts import POOL  # noqa: E402
from cropi.pipeline.requests import store_path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOKEN = "e2e-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ARROW = "application/vnd.apache.arrow.stream"
PROJECTION = {"dim": 256, "kept_fraction": 0.5, "seed": 3}
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
    ranking = load_ranking(store_path(root), "ck", pool=POOL, spec_id=spec_id)
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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, OSError):
        return False


def test_a_killed_server_resumes_scoring_and_serves_the_reference_results(world, reference, tmp_path):
    server = Server(tmp_path / "root", world["data"], tmp_path / "server.log")
    server.start()
    try:
        with server.client() as c:
            ids = {}
            for name in SPLITS:
                kind = "pool" if name == "pool" else "validation"
                r = c.post("/v1/datasets", json={"name": name, "path": str(world["files"][name]), "kind": kind})
                assert r.status_code == 201, r.text
                assert r.json()["n_prompts"] == SPLITS[name]
                ids[name] = r.json()["id"]
            r = c.post("/v1/checkpoints", json={
                "name": "ck", "path": str(world["model"]), "pool": ids["pool"],
                "validation": [ids["val_a"], ids["val_b"]], "projection": PROJECTION,
                "trajectories": {k: str(v) for k, v in world["trajectories"].items()}})
            assert r.status_code == 202, r.text
            ck, job_id = r.json()["id"], r.json()["job_id"]
            # wait until the gradients are partly computed, then kill the server without warning
            deadline = time.monotonic() + 300
            while True:
                job = c.get(f"/v1/jobs/{job_id}").json()
                p = job["progress"] or {}
                # any point inside the gradients phase with work left (the pool split alone takes
                # about a second on an idle machine, so not only mid-split)
                stage = p.get("stage", "")
                if stage.startswith("gradients") and (stage != "gradients:val_b" or p["done"] < p["total"]):
                    break
                assert job["state"] in ("queued", "running"), f"the job ended before it could be killed: {job}"
                assert time.monotonic() < deadline, job
                time.sleep(0.01)
        worker_pid = _worker_pid(server.root, job_id)
        server.kill()
        deadline = time.monotonic() + 15
        while worker_pid and alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (worker_pid and alive(worker_pid)), "the worker outlived its server"

        server.start()
        with server.client() as c:
            deadline = time.monotonic() + 600
            while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] in ("queued", "running"):
                assert time.monotonic() < deadline, job
                time.sleep(0.2)
            assert job["state"] == "succeeded", job
            assert job["attempts"] == 2  # resumed once, not restarted from a fresh submission
            _check_ranking(c, ck, reference)
            _check_gradients(c, ck, reference)
            metrics = c.get("/metrics").text
            assert f"cropi_prompts_scored_total {float(SPLITS['pool'])}" in metrics
    finally:
        server.stop()


def _worker_pid(root: Path, job_id: str) -> int | None:
    from cropi_service.jobs.table import JobStore

    return JobStore(root / "service" / "jobs.sqlite").get(job_id).pid


def _check_ranking(c, ck: str, reference) -> None:
    want = reference["ranking"].table
    ranked = want.filter(pc.greater(want["rank"], 0)).sort_by("rank")
    items, offset = [], 0
    while True:
        page = c.get(f"/v1/checkpoints/{ck}/ranking", params={"offset": offset, "limit": 7}).json()
        items += page["items"]
        offset += 7
        if offset >= page["total"]:
            break
    assert [it["prompt_id"] for it in items] == ranked["prompt_id"].to_pylist()
    for v in ("val_a", "val_b"):
        got = np.array([np.nan if it["scores"][v] is None else it["scores"][v] for it in items])
        np.testing.assert_allclose(got, ranked[f"score:{v}"].to_numpy(zero_copy_only=False), rtol=1e-6, atol=1e-9)
    assert page["excluded"] == reference["ranking"].excluded


def _check_gradients(c, ck: str, reference) -> None:
    pool = reference["pool"]
    want = pool.prompt_ids[:5]
    rows = [pool.prompt_ids.index(p) for p in want]
    body = c.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": want}).json()
    assert [it["prompt_id"] for it in body["items"]] == want and body["spec_id"] == reference["spec_id"]
    for it, row in zip(body["items"], rows):
        np.testing.assert_array_equal(np.array(it["vector"], np.float32), pool.vectors[row].astype(np.float32))
        assert it["status"] == pool.columns["status"][row]
    r = c.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": want}, headers={"Accept": ARROW})
    table = pa.ipc.open_stream(pa.py_buffer(r.content)).read_all()
    np.testing.assert_array_equal(np.stack(table["vector"].to_numpy(zero_copy_only=False)), pool.vectors[rows])
    one = c.get(f"/v1/checkpoints/{ck}/gradients/{want[0]}").json()["items"][0]
    np.testing.assert_array_equal(np.array(one["vector"], np.float32), pool.vectors[rows[0]].astype(np.float32))
