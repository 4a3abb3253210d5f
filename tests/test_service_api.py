"""The HTTP service and its job runner, with a fake library and trivial job kinds.

The real pipeline is exercised by tests/test_service_e2e.py; here the library is a fake
whose stored results are known, so pages, vectors and Arrow streams are checked against
brute force, and jobs are the trivial ones in tests/service_jobs.py, run by the real
runner in real worker processes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient


from cropi_service.api.app import create_app
from cropi_service.domain.cache import VersionedCache
from cropi_service.entry.cli import main as cli_main
from cropi_service.base.errors import JobRunningError, PathOutsideRootsError, ServiceConfigError
from cropi_service.jobs.table import JobStore
from cropi_service.base.paths import confine
from support.service import (TOKEN, AUTH, JOBS, ARROW, FakeLibrary, KINDS, make_settings, Env, env, alive, wait_until,
                             assert_error, read_arrow)
from support import service_jobs


# auth

PROTECTED = [("get", "/v1/datasets"), ("get", "/metrics"), ("get", "/openapi.json"), ("get", "/docs"),
             ("post", "/v1/checkpoints"), ("get", "/v1/jobs/job_x"), ("delete", "/v1/jobs/job_x"),
             ("get", "/no/such/route")]


@pytest.mark.parametrize("method,url", PROTECTED)
def test_every_route_but_healthz_needs_the_token(env, method, url):
    call = getattr(env.client, method)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"Authorization": TOKEN}):
        r = call(url, headers=headers)
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
    assert call(url, headers=AUTH).status_code != 401


def test_healthz_is_open(env):
    r = env.client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_without_a_token_nothing_is_asked(tmp_path):
    app = create_app(make_settings(tmp_path, token=None), library=FakeLibrary(tmp_path), kinds=KINDS)
    with TestClient(app) as client:
        assert client.get("/v1/datasets").status_code == 200


def test_serve_refuses_a_public_host_without_a_token(tmp_path, capsys):
    with pytest.raises(ServiceConfigError, match="token"):
        make_settings(tmp_path, token=None, host="0.0.0.0").check_bind()
    make_settings(tmp_path, host="0.0.0.0").check_bind()  # with a token: allowed
    make_settings(tmp_path, token=None, host="127.0.0.1").check_bind()
    assert cli_main(["serve", "--root", str(tmp_path), "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "refusing to bind" in capsys.readouterr().err
    empty = tmp_path / "token"
    empty.write_text("  \n")
    assert cli_main(["serve", "--root", str(tmp_path), "--token-file", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err


# path confinement

def test_paths_must_resolve_under_a_data_root(env, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_text('{"prompt_id": "s"}\n')
    (env.data / "sub").mkdir()
    (env.data / "escape").symlink_to(outside)                   # a symlinked folder pointing out
    (env.data / "link.jsonl").symlink_to(secret)                # a symlinked file pointing out
    inside = env.data / "ok.jsonl"
    inside.write_text('{"prompt_id": "a"}\n{"prompt_id": "b"}\n')
    (env.data / "inner.jsonl").symlink_to(inside)               # a symlink that stays inside
    bad = [str(secret), str(env.data / ".." / "outside" / "secret.jsonl"), "../outside/secret.jsonl",
           str(env.data / "escape" / "secret.jsonl"), str(env.data / "link.jsonl"),
           str(env.data / "sub" / ".." / ".." / "outside" / "secret.jsonl"), "/etc/passwd", "data\x00.jsonl"]
    for i, path in enumerate(bad):
        r = env.post("/v1/datasets", json={"name": f"bad{i}", "path": path, "kind": "pool"})
        assert_error(r, 403, "path_outside_roots")
    for i, path in enumerate([str(inside), "ok.jsonl", str(env.data / "inner.jsonl"), "sub/../ok.jsonl"]):
        r = env.post("/v1/datasets", json={"name": f"good{i}", "path": path, "kind": "pool"})
        assert r.status_code == 201, r.text
        assert r.json()["path"] == str(inside) and r.json()["n_prompts"] == 2
    # a checkpoint's model folder and trajectory folders are confined as well
    pool, val = env.dataset("pool", "pool"), env.dataset("gsm", "validation")
    for body in ({"path": str(outside)}, {"path": str(env.data / "escape")},
                 {"trajectories": {"pool": str(outside)}}):
        full = {"name": "c", "path": str(env.data / "model"), "pool": pool, "validation": [val], **body}
        assert_error(env.post("/v1/checkpoints", json=full), 403, "path_outside_roots")


def test_confine_against_a_brute_force_walk(tmp_path):
    """Every path built from a small alphabet of steps is accepted iff its realpath is under the root."""
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (root / "up").symlink_to(tmp_path)
    (root / "a" / "in").symlink_to(root / "a" / "b")
    steps = ["a", "b", "..", "up", "in", "out", "."]
    import itertools

    for n in range(1, 4):
        for combo in itertools.product(steps, repeat=n):
            path = str(root.joinpath(*combo))
            real = Path(os.path.realpath(path))
            expected = real == root.resolve() or root.resolve() in real.parents
            try:
                got = confine(path, [root]) == real
            except PathOutsideRootsError:
                got = False
            assert got == expected, path


# body limit

def test_bodies_over_the_limit_are_refused(env):
    big = {"prompt_ids": ["x" * 100] * 1000, "split": "pool"}  # about 100 KiB of JSON
    r = env.post("/v1/checkpoints/ck_x/gradients:batch", json=big)
    assert_error(r, 413, "body_too_large")

    def chunks():  # no Content-Length: the limit must hold while streaming
        for _ in range(100):
            yield b" " * 1024

    r = env.post("/v1/datasets", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413, "body_too_large")
    small = {"prompt_ids": ["x"] * 100}
    assert env.post("/v1/checkpoints/ck_x/gradients:batch", json=small).status_code == 404


# error shapes

def test_unknown_ids_are_404_with_the_error_shape(env):
    for url in ("/v1/datasets/ds_nope", "/v1/checkpoints/ck_nope", "/v1/jobs/job_nope",
                "/v1/checkpoints/ck_nope/ranking", "/v1/checkpoints/ck_nope/gradients/p1",
                "/v1/curricula/cur_nope", "/v1/curricula/cur_nope/stages/0/subset", "/v1/nothing"):
        assert_error(env.get(url), 404, "not_found")
    assert_error(env.delete("/v1/jobs/job_nope"), 404, "not_found")
    assert_error(env.client.put("/v1/datasets", headers=AUTH), 405, "method_not_allowed")


def test_invalid_requests_are_422_with_the_error_shape(env):
    pool = env.dataset("pool", "pool")
    cases = [("/v1/datasets", {"name": "x"}), ("/v1/datasets", {"name": "../x", "path": "a", "kind": "pool"}),
             ("/v1/datasets", {"name": "x", "path": "a", "kind": "other"}),
             ("/v1/checkpoints", {"name": "c", "path": "model", "pool": pool, "validation": []}),
             ("/v1/checkpoints", {"name": "c", "path": "model", "pool": pool, "validation": ["v"], "extra": 1})]
    for url, body in cases:
        r = env.post(url, json=body)
        assert_error(r, 422, "validation_error")
    r = env.post("/v1/datasets", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 422, "validation_error")
    assert_error(env.get("/v1/checkpoints/ck_x/ranking?limit=0"), 422, "validation_error")
    # the projection spec is validated the same way
    r = env.checkpoint("c", projection={"dim": "many"})
    assert_error(r, 422, "validation_error")
    assert "dim" in r.json()["error"]["message"]


def test_bad_input_is_400(env):
    pool, val = env.dataset("pool", "pool"), env.dataset("gsm", "validation")
    (env.data / "bad.jsonl").write_text("not a prompt\n")
    assert_error(env.post("/v1/datasets", json={"name": "b", "path": "bad.jsonl", "kind": "pool"}), 400, "invalid_input")
    assert_error(env.post("/v1/datasets", json={"name": "m", "path": "missing.jsonl", "kind": "pool"}), 400,
                 "invalid_input")
    base = {"name": "c", "path": str(env.data / "model")}
    assert_error(env.post("/v1/checkpoints", json={**base, "pool": val, "validation": [val]}), 400, "invalid_input")
    assert_error(env.post("/v1/checkpoints", json={**base, "pool": pool, "validation": [pool]}), 400, "invalid_input")
    assert_error(env.post("/v1/checkpoints", json={**base, "pool": pool, "validation": [val, val]}), 400,
                 "invalid_input")
    reserved = env.dataset("fused", "validation")
    assert_error(env.post("/v1/checkpoints", json={**base, "pool": pool, "validation": [reserved]}), 400,
                 "invalid_input")
    assert_error(env.post("/v1/checkpoints", json={**base, "path": "pool.jsonl", "pool": pool, "validation": [val]}),
                 400, "invalid_input")
    r = env.post("/v1/checkpoints", json={**base, "pool": pool, "validation": [val], "trajectories": {"nope": "x"}})
    assert_error(r, 400, "invalid_input")
    assert_error(env.post("/v1/checkpoints", json={**base, "pool": "ds_nope", "validation": [val]}), 404, "not_found")


def test_duplicate_dataset_names_conflict(env):
    env.dataset("pool", "pool")
    r = env.post("/v1/datasets", json={"name": "pool", "path": "pool.jsonl", "kind": "pool"})
    assert_error(r, 409, "already_exists")
    listed = env.get("/v1/datasets").json()["items"]
    assert [d["name"] for d in listed] == ["pool"]
    assert env.get(f"/v1/datasets/{listed[0]['id']}").json() == listed[0]


def test_a_second_scoring_of_the_same_checkpoint_and_spec_conflicts(env):
    first = env.checkpoint("ck", release=False)
    assert first.status_code == 202, first.text
    job_id = first.json()["job_id"]
    assert_error(env.checkpoint("ck", release=False), 409, "job_running")
    other_spec = env.checkpoint("ck", release=False, projection={"seed": 1})
    assert other_spec.status_code == 202  # another spec of the same checkpoint may run beside it
    assert env.checkpoint("ck2", release=False).status_code == 202
    env.delete(f"/v1/jobs/{job_id}")
    assert env.checkpoint("ck", release=True).status_code == 202  # once cancelled, it may start again
    for name in ("ck", "ck2"):
        env.release(name)


# results: ranking pages and gradients against brute force

def expected_order(raw: dict, order: str) -> list[str]:
    ok = [i for i, s in enumerate(raw["status"]) if s == "ok"]
    if order == "fused":
        return [raw["ids"][i] for i in sorted(ok, key=lambda i: -raw["fused"][i])]
    score = raw["scores"][order]
    key = lambda i: (-score[i] if math.isfinite(score[i]) else math.inf, raw["rank"][i])  # noqa: E731
    return [raw["ids"][i] for i in sorted(ok, key=key)]


def test_ranking_pages_match_brute_force(env):
    r = env.checkpoint("ck")
    ck, job = r.json()["id"], r.json()["job_id"]
    assert env.wait(job)["state"] == "succeeded"
    raw = env.fake.raw_ranking("ck")
    n_ok = raw["status"].count("ok")
    for order in ("fused", "gsm", "math"):
        items, offset = [], 0
        while True:
            q = f"?offset={offset}&limit=50" + ("" if order == "fused" else f"&validation={order}")
            page = env.get(f"/v1/checkpoints/{ck}/ranking{q}").json()
            assert page["total"] == n_ok and page["order"] == order and page["offset"] == offset
            if not page["items"]:
                break
            items += page["items"]
            offset += 50
        assert [it["prompt_id"] for it in items] == expected_order(raw, order)
        assert [it["position"] for it in items] == list(range(1, n_ok + 1))
        for it in items:
            i = raw["ids"].index(it["prompt_id"])
            assert it["rank"] == raw["rank"][i] and it["fused"] == pytest.approx(raw["fused"][i])
            assert it["selected"] == (raw["rank"][i] <= 20)
            for v in ("gsm", "math"):
                s = raw["scores"][v][i]
                assert (it["scores"][v] is None) if math.isnan(s) else it["scores"][v] == pytest.approx(s)
    assert page["excluded"] == {s: raw["status"].count(s) for s in ("zero_advantage", "nonfinite")}
    assert_error(env.get(f"/v1/checkpoints/{ck}/ranking?validation=nope"), 400, "invalid_input")
    checkpoint = env.get(f"/v1/checkpoints/{ck}").json()
    assert checkpoint["job"]["state"] == "succeeded" and checkpoint["spec_id"].startswith("spec-")
    for other in ("datasets", "curricula"):  # an id of one kind names nothing of another
        assert_error(env.get(f"/v1/{other}/{ck}"), 404, "not_found")


def test_the_ranking_is_cached_until_the_stored_one_changes(env):
    r = env.checkpoint("ck")
    ck = r.json()["id"]
    env.wait(r.json()["job_id"])
    for _ in range(5):
        env.get(f"/v1/checkpoints/{ck}/ranking?limit=10")
    assert env.fake.ranking_loads == 1
    env.fake.version += 1  # the stored ranking changed
    env.get(f"/v1/checkpoints/{ck}/ranking")
    env.get(f"/v1/checkpoints/{ck}/ranking?validation=gsm")
    assert env.fake.ranking_loads == 2


def test_results_wait_for_the_job(env):
    r = env.checkpoint("ck", release=False)
    ck = r.json()["id"]
    env.wait(r.json()["job_id"], states=("running",))
    assert_error(env.get(f"/v1/checkpoints/{ck}/ranking"), 409, "not_ready")
    assert_error(env.get(f"/v1/checkpoints/{ck}/gradients/p001"), 409, "not_ready")
    env.release("ck")
    env.wait(r.json()["job_id"])
    assert env.get(f"/v1/checkpoints/{ck}/ranking").status_code == 200


def test_gradients_as_json_and_arrow_equal_the_stored_vectors(env):
    r = env.checkpoint("ck")
    ck = r.json()["id"]
    env.wait(r.json()["job_id"])
    for split in ("pool", "gsm"):
        stored = env.fake.raw_gradients(split)
        want = [stored.prompt_ids[i] for i in (5, 0, 3, len(stored.prompt_ids) - 1)]
        rows = [stored.prompt_ids.index(p) for p in want]
        body = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": want, "split": split}).json()
        assert body["dim"] == FakeLibrary.dim and body["split"] == split
        assert [it["prompt_id"] for it in body["items"]] == want
        for it, row in zip(body["items"], rows):
            assert np.array_equal(np.array(it["vector"], np.float32), stored.vectors[row].astype(np.float32))
            nrm = stored.columns["raw_norm"][row]
            assert it["raw_norm"] is None if math.isnan(nrm) else it["raw_norm"] == pytest.approx(nrm)
            assert it["status"] == stored.columns["status"][row] and it["n_responses"] == 8
            assert it["n_tokens"] == stored.columns["n_tokens"][row]
        r = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": want, "split": split},
                     headers={"Accept": ARROW})
        assert r.headers["content-type"] == ARROW
        table = read_arrow(r.content)
        assert table["prompt_id"].to_pylist() == want
        assert table.schema.field("vector").type == pa.list_(pa.float16(), FakeLibrary.dim)
        assert np.array_equal(np.stack(table["vector"].to_numpy(zero_copy_only=False)), stored.vectors[rows])
        assert table["status"].to_pylist() == [stored.columns["status"][i] for i in rows]
        assert table.schema.metadata[b"split"] == split.encode()
    # one prompt, including an id with a slash in it
    one = env.get(f"/v1/checkpoints/{ck}/gradients/dir/with slash").json()
    assert one["items"][0]["prompt_id"] == "dir/with slash"
    arrow = read_arrow(env.get(f"/v1/checkpoints/{ck}/gradients/p01", headers={"Accept": ARROW}).content)
    assert arrow["prompt_id"].to_pylist() == ["p01"]
    assert_error(env.get(f"/v1/checkpoints/{ck}/gradients/nope"), 404, "not_found")
    assert_error(env.get(f"/v1/checkpoints/{ck}/gradients/p01?split=other"), 404, "not_found")
    r = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": ["p01", "zz"]})
    assert_error(r, 404, "not_found")
    assert "zz" in r.json()["error"]["message"]
    assert env.fake.gradient_loads == 2  # one load per split, then served from the cache


# jobs: failure, cancel, resume

def test_failures_are_recorded_with_their_code(tmp_path):
    jobs = JobStore(make_settings(tmp_path).db_path)
    kinds = {"scoring": f"{JOBS}:fail_job", "curriculum": f"{JOBS}:crash_job"}
    (tmp_path / "data" / "model").mkdir(parents=True)
    app = create_app(make_settings(tmp_path), library=FakeLibrary(tmp_path), kinds=kinds)
    with TestClient(app) as client:
        e = Env(tmp_path, client, FakeLibrary(tmp_path))
        job = e.wait(e.checkpoint("ck", release=False).json()["job_id"])
        assert job["state"] == "failed" and job["error"]["code"] == "invalid_input"
        assert "refuses its input" in job["error"]["message"]
        body = {"name": "cur", "path": "model", "pool": e.ids["pool"], "validation": [e.ids["gsm"]]}
        job = e.wait(e.post("/v1/curricula", json=body).json()["job_id"])
        assert job["state"] == "failed" and job["error"]["code"] == "worker_died"
        assert "code 7" in job["error"]["message"]
    assert jobs.counts()["failed"] == 2


def test_cancel_stops_the_worker(env):
    r = env.checkpoint("ck", release=False)
    job_id = r.json()["job_id"]
    env.wait(job_id, states=("running",))
    jobs = JobStore(env.tmp / "root" / "service" / "jobs.sqlite")
    wait_until(lambda: jobs.get(job_id).progress is not None, what="the worker's first progress report")
    pid = jobs.get(job_id).pid
    assert alive(pid)
    cancelled = env.delete(f"/v1/jobs/{job_id}")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    wait_until(lambda: not alive(pid), what="the worker to stop")
    job = env.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "cancelled"  # the dying worker wrote nothing over it
    assert job["progress"]["stage"] == "waiting" and job["progress"]["done"] >= 1
    assert env.delete(f"/v1/jobs/{job_id}").json()["state"] == "cancelled"  # cancelling twice is harmless
    done = env.checkpoint("ck2")
    env.wait(done.json()["job_id"])
    assert_error(env.delete(f"/v1/jobs/{done.json()['job_id']}"), 409, "job_finished")


def test_job_attempts_are_fenced(tmp_path):
    jobs = JobStore(tmp_path / "jobs.sqlite")
    job = jobs.create("k", "m:f", {"a": 1}, key="same")
    with pytest.raises(JobRunningError):
        jobs.create("k", "m:f", {}, key="same")
    first = jobs.claim("r1", max_attempts=2)
    assert first.id == job.id and first.attempts == 1 and first.state == "running"
    assert jobs.claim("r1", max_attempts=2) is None
    assert jobs.requeue_owned("r1") == [job.id]
    second = jobs.claim("r2", max_attempts=2)
    assert second.attempts == 2
    assert not jobs.report(job.id, 1, "s", 1, 2) and not jobs.finish(job.id, 1, "succeeded", result={})
    assert jobs.report(job.id, 2, "s", 1, 2) and jobs.get(job.id).progress == {"stage": "s", "done": 1, "total": 2}
    jobs.requeue_owned("r2")  # runner restarts do not count against the job
    for attempt in (3, 4):
        assert jobs.claim("r1", max_attempts=2).attempts == attempt
        assert not jobs.requeue_died(job.id, attempt - 1, {"code": "worker_died", "message": "stale"})
        assert jobs.requeue_died(job.id, attempt, {"code": "worker_died", "message": f"signal 9 ({attempt})"})
    assert jobs.claim("r1", max_attempts=2) is None  # its worker died twice: failed, not started again
    failed = jobs.get(job.id)
    assert failed.state == "failed" and failed.error["code"] == "worker_died" and failed.failures == 2
    assert "died 2 times" in failed.error["message"] and "signal 9 (4)" in failed.error["message"]
    assert jobs.create("k", "m:f", {}, key="same").state == "queued"  # the key is free again


def test_a_job_resumes_after_its_runner_is_killed(tmp_path):
    """SIGKILL a runner process mid-job: its worker goes too, and a restarted runner continues the job."""
    settings = make_settings(tmp_path)
    jobs = JobStore(settings.db_path)
    work = tmp_path / "work"
    job = jobs.create("steps", f"{JOBS}:steps_job", {"dir": str(work), "steps": 12, "sleep": 0.15})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    cmd = [sys.executable, "-m", "cropi_service", "worker", "--root", str(settings.root), "--name", "w1"]

    def start():
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    runner = start()
    try:
        wait_until(lambda: (jobs.get(job.id).progress or {}).get("done", 0) >= 3, what="progress")
        worker_pid = jobs.get(job.id).pid
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        wait_until(lambda: not alive(worker_pid), what="the orphaned worker to die")
        assert jobs.get(job.id).state == "running"  # nobody said otherwise: the runner died silently
        done_before = len((work / "done").read_text().splitlines())
        assert 3 <= done_before < 12
        runner = start()
        wait_until(lambda: jobs.get(job.id).state == "succeeded", timeout=30, what="the resumed job")
    finally:
        runner.terminate()
        runner.wait()
    steps = [int(line.split()[0]) for line in (work / "done").read_text().splitlines()]
    assert steps == list(range(12))  # every step once: resumed, not restarted
    assert len((work / "starts").read_text().splitlines()) == 2 and jobs.get(job.id).attempts == 2
    pids = {line.split()[1] for line in (work / "done").read_text().splitlines()}
    assert len(pids) == 2


def test_a_stopped_service_resumes_its_jobs_on_start(tmp_path):
    """A graceful stop hands running jobs back to the queue; the next start runs them to the end."""
    settings = make_settings(tmp_path)
    (tmp_path / "data").mkdir()
    work = tmp_path / "work"
    jobs = JobStore(settings.db_path)
    job = jobs.create("steps", f"{JOBS}:steps_job", {"dir": str(work), "steps": 40, "sleep": 0.05})
    with TestClient(create_app(settings, library=FakeLibrary(tmp_path), kinds=KINDS)):
        wait_until(lambda: (jobs.get(job.id).progress or {}).get("done", 0) >= 2, what="progress")
    assert jobs.get(job.id).state == "queued"
    with TestClient(create_app(settings, library=FakeLibrary(tmp_path), kinds=KINDS)):
        wait_until(lambda: jobs.get(job.id).state == "succeeded", timeout=30, what="the job to finish")
    steps = [int(line.split()[0]) for line in (work / "done").read_text().splitlines()]
    assert steps == list(range(40))


# curricula, metrics

def test_curriculum_stages_download_as_parquet(env):
    pool, val = env.dataset("pool", "pool"), env.dataset("gsm", "validation")
    r = env.post("/v1/curricula", json={"name": "cur", "path": "model", "pool": pool, "validation": [val],
                                        "stages": 3})
    assert r.status_code == 202, r.text
    cur = r.json()["id"]
    env.wait(r.json()["job_id"])
    view = env.get(f"/v1/curricula/{cur}").json()
    assert [s["index"] for s in view["stages"]] == [0, 1, 2] and view["job"]["state"] == "succeeded"
    assert [[w["code"] for w in s["warnings"]] for s in view["stages"]] == [["filled_to_batch"], [], []]
    assert [s["ranking_change"] for s in view["stages"]] == [None, {"prompts": 10, "spearman": 0.1},
                                                             {"prompts": 10, "spearman": 0.2}]  # the record's, as is
    import pyarrow.parquet as pq

    for s in view["stages"]:
        got = env.get(s["subset_url"])
        assert got.status_code == 200 and got.headers["content-type"] == "application/vnd.apache.parquet"
        table = pq.read_table(pa.py_buffer(got.content))
        assert table.num_rows == s["n_prompts"] == s["index"] + 1
    assert_error(env.get(f"/v1/curricula/{cur}/stages/3/subset"), 404, "not_found")


def test_metrics_count_requests_jobs_and_prompts(env):
    r = env.checkpoint("ck")
    env.wait(r.json()["job_id"])
    ck = r.json()["id"]
    for _ in range(3):
        env.get(f"/v1/checkpoints/{ck}/ranking")
    text = env.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("cropi_http_request_duration_seconds_count")
                and 'route="/v1/checkpoints/{checkpoint_id}/ranking"' in ln)
    assert line.endswith(" 3.0")
    assert 'cropi_jobs{state="succeeded"} 1.0' in text
    assert f"cropi_prompts_scored_total {float(FakeLibrary.pool_size)}" in text


def test_the_cache_loads_once_under_concurrency():
    cache: VersionedCache[int] = VersionedCache(2, lambda v: 1)  # a byte each: two entries fit
    calls = []

    def load():
        calls.append(1)
        time.sleep(0.05)
        return len(calls)

    threads = [threading.Thread(target=cache.get, args=("k", 1, load)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and cache.get("k", 1, load) == 1
    assert cache.get("k", 2, load) == 2  # a new version reloads
    cache.get("a", 0, load), cache.get("b", 0, load)
    assert cache.get("k", 2, load) == 5  # evicted (size 2), loaded again


# property-based: no input makes the service fail with a 5xx

def test_no_request_makes_a_server_error(tmp_path):
    """Schemathesis cases from the OpenAPI document; half of them with real ids swapped in, so
    requests reach past the 404s into rankings, gradients and job submission."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    (tmp_path / "data" / "model").mkdir(parents=True)
    fake = FakeLibrary(tmp_path)
    app = create_app(make_settings(tmp_path), library=fake, kinds={"scoring": f"{JOBS}:instant_job",
                                                                  "curriculum": f"{JOBS}:curriculum_job"})
    with TestClient(app) as client:
        e = Env(tmp_path, client, fake)
        done = e.checkpoint("ck").json()
        e.wait(done["job_id"])
        cur = e.post("/v1/curricula", json={"name": "cur", "path": "model", "pool": e.ids["pool"],
                                            "validation": [e.ids["gsm"]], "stages": 2}).json()
        e.wait(cur["job_id"])
        real = {"checkpoint_id": done["id"], "job_id": done["job_id"], "dataset_id": e.ids["pool"],
                "curriculum_id": cur["id"], "prompt_id": "p01", "index": 1}
        schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)
        statuses: dict[int, int] = {}
        budget = time.monotonic() + 60  # bounded in time: the cases left when it runs out are skipped
        for op in schema.get_all_operations():
            operation = op.ok()
            if time.monotonic() > budget:
                break

            @settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(), swap=st.booleans())
            def check(case, swap):
                if time.monotonic() > budget:
                    return
                if swap:
                    if case.path_parameters:
                        case.path_parameters = {k: real.get(k, v) for k, v in case.path_parameters.items()}
                    if isinstance(case.body, dict) and "pool" in case.body:
                        case.body = {**case.body, "pool": e.ids["pool"], "validation": [e.ids["gsm"]], "path": "model"}
                response = case.call(headers=AUTH)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                assert response.status_code < 500, (case.method, case.formatted_path, response.text[:300])

            check()
    assert statuses.get(200, 0) + statuses.get(202, 0) > 10, statuses  # the cases did reach real results


def test_vector_text_is_exact_for_every_float16_and_for_float32():
    from cropi_service.domain.views import vector_json

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    parsed = json.loads("[" + vector_json(every) + "]")
    finite = np.isfinite(every)
    assert all(p is None for p, f in zip(parsed, finite) if not f)
    got = np.array([p for p, f in zip(parsed, finite) if f], dtype=np.float64)
    assert np.array_equal(got.astype(np.float16).view(np.uint16), every[finite].view(np.uint16))
    assert np.array_equal(got, every[finite].astype(np.float64))  # the exact value, not a nearby one
    v32 = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert np.array_equal(np.array(json.loads("[" + vector_json(v32) + "]"), np.float32), v32)
