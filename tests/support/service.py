"""The service tests' shared parts: a fake library whose stored results are known, settings, a
client wrapper and its fixture, the hostile-caller fixture, and small checks."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict

from cropi.errors import InvalidInputError
from cropi.pipeline.rank import RankingResult
from cropi_service.api.app import create_app
from cropi_service.base.settings import ServiceSettings
from support import service_jobs


TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOBS = service_jobs.__name__
ARROW = "application/vnd.apache.arrow.stream"
STATUSES = ("ok", "zero_advantage", "nonfinite")
DONE = ("succeeded", "failed", "cancelled")  # the states a job ends in


class FakeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dim: int = 16
    seed: int = 0


@dataclass
class FakeRanking:
    """The fields of cropi's RankingResult the service reads."""
    table: pa.Table
    excluded: dict
    meta: dict


@dataclass
class FakeCheckpoint:
    name: str
    fingerprint: str = "fp"


@dataclass
class FakeGradients:
    """The fields of cropi's GradientTable the service reads."""
    prompt_ids: list
    vectors: np.ndarray
    columns: dict
    checkpoint: FakeCheckpoint
    split: str
    spec_id: str


class FakeLibrary:
    """Stores nothing: rankings and gradients are generated from the checkpoint name."""

    pool_size = 237
    dim = 16

    def __init__(self, release_dir: Path):
        self.release_dir = release_dir
        self.version = 0
        self.ranking_loads = 0
        self.gradient_loads = 0

    def count_prompts(self, path: str) -> int:
        if not Path(path).is_file():  # as the real reader does: a clear 4xx, not an OSError
            raise InvalidInputError(f"{path}: unknown prompt file type; name it *.jsonl or *.parquet")
        text = Path(path).read_text()
        if "not a prompt" in text:
            raise InvalidInputError(f"{path}: line 1 is not a prompt record")
        return len(text.splitlines())

    def projection_spec_id(self, projection):
        spec = FakeSpec.model_validate(projection.model_dump(exclude_none=True) if projection else {})
        return "spec-" + hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:8]

    def raw_ranking(self, name: str) -> dict[str, Any]:
        rng = np.random.default_rng(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
        n = self.pool_size
        ids = [f"p{i:03d}" for i in range(n)]
        status = ["nonfinite" if i % 37 == 5 else "zero_advantage" if i % 11 == 3 else "ok" for i in range(n)]
        ok = np.array([s == "ok" for s in status])
        scores = {v: np.where(ok, rng.normal(size=n), np.nan) for v in ("gsm", "math")}
        scores["math"][np.flatnonzero(ok)[7]] = np.nan  # a ranked prompt without a score on one set
        fused = np.where(ok, rng.uniform(size=n), np.nan)
        order = sorted(np.flatnonzero(ok), key=lambda i: -fused[i])
        rank = np.zeros(n, dtype=np.int64)
        rank[order] = np.arange(1, len(order) + 1)
        return {"ids": ids, "status": status, "scores": scores, "fused": fused, "rank": rank}

    def ranking_version(self, name, spec_id):
        return self.version

    def ranking(self, name, spec_id) -> RankingResult:
        self.ranking_loads += 1
        raw = self.raw_ranking(name)
        perm = np.random.default_rng(1).permutation(len(raw["ids"]))  # stored order must not matter
        cols = {"prompt_id": [raw["ids"][i] for i in perm], "status": [raw["status"][i] for i in perm],
                "rank": raw["rank"][perm], "fused": raw["fused"][perm]}
        cols.update({f"score:{v}": s[perm] for v, s in raw["scores"].items()})
        cols["selected"] = raw["rank"][perm] <= 20
        excluded: dict[str, int] = {}
        for s in raw["status"]:
            if s != "ok":
                excluded[s] = excluded.get(s, 0) + 1
        return FakeRanking(pa.table(cols), excluded, {"spec_id": spec_id})

    def raw_gradients(self, split: str) -> "FakeGradients":
        n = 40 if split == "pool" else 12
        rng = np.random.default_rng(len(split))
        ids = [f"{split[0]}{i:02d}" for i in range(n - 1)] + ["dir/with slash"]
        vectors = rng.normal(size=(n, self.dim)).astype(np.float16)
        raw_norm = rng.uniform(size=n)
        raw_norm[3] = np.nan
        columns = {"raw_norm": raw_norm, "n_responses": np.full(n, 8), "reward_mean": rng.uniform(size=n),
                   "reward_std": rng.uniform(size=n), "n_tokens": rng.integers(10, 99, size=n),
                   "status": [STATUSES[i % 3] for i in range(n)]}
        return FakeGradients(ids, vectors, columns, FakeCheckpoint("x"), split, "spec")

    def gradients_version(self, name, spec_id, split):
        return self.version

    def gradients(self, name, spec_id, split) -> "FakeGradients":
        self.gradient_loads += 1
        return self.raw_gradients(split)

    def curriculum_stages(self, name, result):
        return list((result or {}).get("stages", []))


KINDS = {"scoring": f"{JOBS}:wait_job", "curriculum": f"{JOBS}:curriculum_job"}


def make_settings(tmp: Path, **over) -> ServiceSettings:
    fields = dict(root=tmp / "root", data_roots=[tmp / "data"], token=TOKEN, poll_s=0.05, heartbeat_s=0.5,
                  max_body_bytes=64 * 1024, version_ttl_s=0)
    fields.update(over)
    return ServiceSettings(**fields)


class Env:
    def __init__(self, tmp: Path, client: TestClient, fake: FakeLibrary):
        self.tmp, self.client, self.fake = tmp, client, fake
        self.data = tmp / "data"
        self.ids: dict[str, str] = {}

    def get(self, url: str, **kw):
        return self.client.get(url, headers={**AUTH, **kw.pop("headers", {})}, **kw)

    def post(self, url: str, **kw):
        return self.client.post(url, headers={**AUTH, **kw.pop("headers", {})}, **kw)

    def delete(self, url: str):
        return self.client.delete(url, headers=AUTH)

    def dataset(self, name: str, kind: str, n: int = 3) -> str:
        """The id of dataset ``name``, registered on first use."""
        if name in self.ids:
            return self.ids[name]
        path = self.data / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt_id": f"{name}{i}", "prompt": "q", "answer": "1"}) + "\n"
                                for i in range(n)))
        r = self.post("/v1/datasets", json={"name": name, "path": str(path), "kind": kind})
        assert r.status_code == 201, r.text
        self.ids[name] = r.json()["id"]
        return self.ids[name]

    def checkpoint(self, name: str = "ck", *, release: bool = True, projection=None) -> dict:
        if release:
            self.release(name)
        pool, gsm, math_ = self.dataset("pool", "pool"), self.dataset("gsm", "validation"), self.dataset("math", "validation")
        body = {"name": name, "path": str(self.data / "model"), "pool": pool, "validation": [gsm, math_]}
        if projection is not None:
            body["projection"] = projection
        return self.post("/v1/checkpoints", json=body)

    def release(self, name: str) -> None:
        (self.fake.release_dir / name).touch()

    def wait(self, job_id: str, states=DONE, timeout: float = 30.0) -> dict:
        return wait_job(self.get, job_id, states, timeout)


def wait_job(get, job_id: str, states=DONE, timeout: float = 30.0, every: float = 0.05) -> dict:
    """The job's view once its state is one of ``states``; ``get``: a client's GET that carries the token."""
    deadline = time.monotonic() + timeout
    while True:
        job = get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        if time.monotonic() >= deadline:
            raise AssertionError(f"job {job_id} did not reach {states} in {timeout:g} s: {job}")
        time.sleep(every)


@pytest.fixture
def env(tmp_path):
    (tmp_path / "data" / "model").mkdir(parents=True)
    (tmp_path / "release").mkdir()
    fake = FakeLibrary(tmp_path / "release")
    app = create_app(make_settings(tmp_path), library=fake, kinds=KINDS)
    with TestClient(app) as client:
        yield Env(tmp_path, client, fake)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(cond, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def assert_error(r, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    assert len(body["error"]["message"]) > 20


def read_arrow(content: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(content)).read_all()


@pytest.fixture
def svc(tmp_path):
    data = tmp_path / "data"
    (data / "model").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    for name in ("pool", "gsm"):
        (data / f"{name}.jsonl").write_text(json.dumps({"prompt_id": f"{name}0", "prompt": "1+1?", "answer": "2"}) + "\n")
    settings = ServiceSettings(root=tmp_path / "root", data_roots=[data], token=TOKEN, poll_s=0.05)
    with TestClient(create_app(settings, kinds=KINDS)) as client:
        ids = {}
        for name, kind in (("pool", "pool"), ("gsm", "validation")):
            r = client.post("/v1/datasets", json={"name": name, "path": f"{name}.jsonl", "kind": kind}, headers=AUTH)
            assert r.status_code == 201, r.text
            ids[name] = r.json()["id"]
        yield client, ids, settings


def stored(settings: ServiceSettings) -> tuple:
    """Everything the service keeps: its table rows and the files under its root (the db files aside)."""
    with sqlite3.connect(settings.db_path) as conn:
        rows = tuple(tuple(conn.execute(f"SELECT * FROM {t} ORDER BY id").fetchall())
                     for t in ("datasets", "checkpoints", "curricula", "jobs"))
    files = tuple(sorted(str(p.relative_to(settings.root)) for p in settings.root.rglob("*")
                         if "jobs.sqlite" not in p.name))
    return rows, files
