"""The service against a careless operator and a crashing machine: a ranking never replaced
under a checkpoint id, paths confined again when a job starts, input limits, ``Connection:
close`` after a server error, files on disk changed under a running server, restarts and
worker deaths during a job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient


from cropi.store import CheckpointRef, GradientStore
from cropi_service.api.app import create_app
from cropi_service.base.errors import PathOutsideRootsError
from cropi_service.domain.registry import CheckpointRow, Registry, new_id
from cropi_service.domain.service import scoring_key
from cropi_service.base.settings import ServiceSettings
from cropi_service.options.params import scoring_request
from cropi_service.jobs.table import JobStore
from support.service import AUTH, TOKEN, stored, svc, wait_until
from support import service_jobs


def add_validation(client, settings, name: str) -> str:
    path = settings.data_roots[0] / f"{name}.jsonl"
    path.write_text(json.dumps({"prompt_id": f"{name}0", "prompt": "2+2?", "answer": "4"}) + "\n")
    r = client.post("/v1/datasets", json={"name": name, "path": path.name, "kind": "validation"}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["id"]


# item 4: a checkpoint id keeps serving its own ranking

def test_scoring_a_name_and_spec_again_from_other_inputs_is_refused(svc):
    client, ids, settings = svc
    release = settings.root.parent / "release"
    release.mkdir()
    (release / "ck").touch()
    base = {"name": "ck", "path": "model", "pool": ids["pool"], "validation": [ids["gsm"]]}
    first = client.post("/v1/checkpoints", json=base, headers=AUTH)
    assert first.status_code == 202, first.text
    deadline = time.monotonic() + 30
    while client.get(f"/v1/jobs/{first.json()['job_id']}", headers=AUTH).json()["state"] != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    math_ = add_validation(client, settings, "math")
    before = stored(settings)
    for other in ({**base, "validation": [ids["gsm"], math_]},
                  {**base, "options": {"top_fraction": 0.5}},
                  {**base, "options": {"collect": {"pool_samples": 4}}}):
        r = client.post("/v1/checkpoints", json=other, headers=AUTH)
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "ranking_conflict"
        assert first.json()["id"] in r.json()["error"]["message"] and "another name" in r.json()["error"]["message"]
        assert stored(settings) == before
    # the same inputs again (a rescoring) and another spec of the same name are fine
    assert client.post("/v1/checkpoints", json=base, headers=AUTH).status_code == 202
    other_spec = {**base, "validation": [ids["gsm"], math_], "projection": {"seed": 7}}
    assert client.post("/v1/checkpoints", json=other_spec, headers=AUTH).status_code == 202


# item 6: confinement checked again when the job starts

def test_a_job_refuses_files_that_left_the_roots_after_the_request(svc, tmp_path):
    client, ids, settings = svc
    release = settings.root.parent / "release"
    release.mkdir()
    body = {"name": "ck", "path": "model", "pool": ids["pool"], "validation": [ids["gsm"]]}
    r = client.post("/v1/checkpoints", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    job = JobStore(settings.db_path).get(r.json()["job_id"])
    (release / "ck").touch()
    model = settings.data_roots[0] / "model"
    secret = tmp_path / "elsewhere" / "secret.safetensors"
    secret.write_text("outside")
    # a file inside the confined folder that is a symlink to outside the roots
    (model / "model.safetensors").symlink_to(secret)
    with pytest.raises(PathOutsideRootsError, match="outside the service's data roots"):
        scoring_request(job.params)
    (model / "model.safetensors").unlink()
    scoring_request(job.params)  # clean again: accepted
    # the folder itself swapped for a symlink after the POST
    model.rename(settings.data_roots[0] / "model.orig")
    model.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PathOutsideRootsError):
        scoring_request(job.params)


# item 7: input limits

def test_long_paths_are_refused_with_a_4xx(svc):
    client, ids, settings = svc
    before = stored(settings)
    for path in ("a" * 300, "x/" + "b" * 256 + "/model"):
        r = client.post("/v1/datasets", json={"name": "d", "path": path, "kind": "pool"}, headers=AUTH)
        assert r.status_code == 400 and "255" in r.json()["error"]["message"], r.text
        r = client.post("/v1/checkpoints", json={"name": "ck", "path": path, "pool": ids["pool"],
                                                 "validation": [ids["gsm"]]}, headers=AUTH)
        assert r.status_code == 400, r.text
    deep = "/".join(["a"] * 200_000)  # refused by its length before any file call
    r = client.post("/v1/datasets", json={"name": "d", "path": deep, "kind": "pool"}, headers=AUTH)
    assert r.status_code == 422 and "path" in r.json()["error"]["message"]
    r = client.get("/v1/checkpoints/ck_x/gradients/" + "p" * 5000, headers=AUTH)
    assert r.status_code == 422, r.text
    assert stored(settings) == before


def test_a_server_error_closes_the_connection(svc):
    client, ids, settings = svc

    def broken():
        raise RuntimeError("a bug")

    client.app.state.service.registry.datasets = broken
    with TestClient(client.app, raise_server_exceptions=False) as c:
        r = c.get("/v1/datasets", headers=AUTH)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert r.headers["connection"] == "close"


# item 2: files on disk changed under a running server

NAME, DIM, N = "disk", 16, 40


def write_store(root: Path) -> tuple[str, np.ndarray]:
    """A real pool split (one writer, several shards); returns the spec id and the vectors."""
    from cropi.projection import ProjectionSpec

    spec = ProjectionSpec(dim=DIM)
    store = GradientStore(str(root / "store"))
    split = store.split(CheckpointRef(name=NAME, fingerprint="fp"), spec.model_dump() | {"spec_id": spec.spec_id},
                        "pool", dim=DIM, dtype="float16")
    vectors = np.random.default_rng(0).standard_normal((N, DIM)).astype(np.float16)
    with split.writer("w0", rows_per_shard=10) as w:
        for i, v in enumerate(vectors):
            w.append(f"p{i:02d}", v, 1.0, 8, 0.5, 0.3, 100, "ok")
    return spec.spec_id, vectors


def register_scored(settings: ServiceSettings, spec_id: str) -> str:
    registry, jobs = Registry(settings.db_path), JobStore(settings.db_path)
    pool = registry.add_dataset("pool_set", "/synthetic/pool.jsonl", "pool", N).id
    job = jobs.create("scoring", "builtin", {"name": NAME}, key=scoring_key(NAME, spec_id))
    claimed = jobs.claim("test", max_attempts=1)
    jobs.finish(job.id, claimed.attempts, "succeeded", result={"spec_id": spec_id})
    row = CheckpointRow(new_id("ck"), NAME, "/synthetic/model", pool, [], spec_id, job.id, time.time())
    registry.add_checkpoint(row)
    return row.id


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_shard_changed_on_disk_is_never_served_changed_and_never_kills_the_server(tmp_path, damage):
    settings = ServiceSettings(root=tmp_path / "root", token=TOKEN, version_ttl_s=0, workers=0)
    spec_id, vectors = write_store(settings.root)
    ck = register_scored(settings, spec_id)
    with TestClient(create_app(settings, runner=False), raise_server_exceptions=False) as client:
        def vector(i: int):
            r = client.get(f"/v1/checkpoints/{ck}/gradients/p{i:02d}", headers=AUTH)
            return r, (np.array(r.json()["items"][0]["vector"], np.float16) if r.status_code == 200 else None)

        r, v = vector(3)
        assert r.status_code == 200 and np.array_equal(v, vectors[3])
        shards = sorted(p for p in (settings.root / "store").rglob("*") if p.is_file() and p.stat().st_size > 200
                        and "commit" not in str(p) and p.suffix != ".json")
        assert shards, list((settings.root / "store").rglob("*"))
        for shard in shards:
            data = bytearray(shard.read_bytes())
            if damage == "truncate":
                shard.write_bytes(bytes(data[: len(data) // 2]))
            elif damage == "flip":
                data[len(data) // 2] ^= 0x40
                shard.write_bytes(bytes(data))
            else:
                shard.unlink()
        for i in range(N):
            r, v = vector(i)
            assert r.status_code != 200 or np.array_equal(v, vectors[i]), (damage, i)  # never silently changed
            if r.status_code != 200:
                assert r.status_code < 600 and set(r.json()["error"]) == {"code", "message"}
        assert client.get("/healthz").status_code == 200  # alive


# item 5: restarts do not count as attempts; a worker killed alone is retried

def test_restarts_do_not_fail_a_job_and_a_killed_worker_is_retried(tmp_path):
    settings = ServiceSettings(root=tmp_path / "root", data_roots=[tmp_path], token=TOKEN, poll_s=0.05,
                               max_attempts=2)
    jobs = JobStore(settings.db_path)
    work = tmp_path / "work"
    job = jobs.create("steps", f"{service_jobs.__name__}:steps_job",
                      {"dir": str(work), "steps": 30, "sleep": 0.1})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    logs = tmp_path / "runner.log"
    cmd = [sys.executable, "-m", "cropi_service", "worker", "--root", str(settings.root), "--name", "w1"]

    def start():
        return subprocess.Popen(cmd, env={**env, "CROPI_SERVICE_MAX_ATTEMPTS": "2"}, stdout=subprocess.DEVNULL,
                                stderr=open(logs, "ab"))

    def done() -> int:
        return len((work / "done").read_text().splitlines()) if (work / "done").exists() else 0

    runner = start()
    try:
        for restart in range(3):  # more restarts than max_attempts
            target = done() + 2
            wait_until(lambda: done() >= target, 60, "progress")
            runner.send_signal(signal.SIGKILL if restart % 2 else signal.SIGTERM)
            runner.wait()
            runner = start()
        for _ in range(1):  # the worker alone killed, as the OOM killer would (max_attempts=2: one death is fine)
            target = done() + 2
            wait_until(lambda: done() >= target and jobs.get(job.id).pid, 60, "progress")
            os.kill(jobs.get(job.id).pid, signal.SIGKILL)
        wait_until(lambda: jobs.get(job.id).state == "succeeded", 90, "the job to finish")
    finally:
        runner.terminate()
        runner.wait()
    final = jobs.get(job.id)
    assert final.failures == 1 and final.attempts >= 5
    steps = [int(line.split()[0]) for line in (work / "done").read_text().splitlines()]
    assert sorted(set(steps)) == list(range(30))
    text = logs.read_text()
    assert "worker died; job queued again to resume" in text
    assert "resuming jobs left running by a previous process" in text
