"""Attacks within the API's own limits (issue 20), each performed: a batch too large for one
response, batches piling up, splits cycled through the gradient cache, a flood of jobs, a second
runner on one root, duplicate Authorization headers, registrations piling up."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cropi.store import CheckpointRef, shard_io
from cropi_service.api.app import create_app
from cropi_service.api.middleware import caller_of
from cropi_service.base.errors import ServiceConfigError
from cropi_service.domain.library import CropiLibrary
from cropi_service.domain.views import GradientView, record_bytes_bound
from cropi_service.jobs.runner import Runner
from cropi_service.jobs.table import JobStore, QueueLimits
from support.service import AUTH, KINDS, TOKEN, Env, FakeLibrary, make_settings
from support.store import SPEC, grad_row, open_split, write_grads

OTHER = "second-caller-token-9876543210"


def _env(tmp_path, **over):
    (tmp_path / "data" / "model").mkdir(parents=True, exist_ok=True)
    (tmp_path / "release").mkdir(exist_ok=True)
    fake = FakeLibrary(tmp_path / "release")
    app = create_app(make_settings(tmp_path, **over), library=fake, kinds=KINDS)
    return app, fake


def _ready(env: Env) -> str:
    r = env.checkpoint("ck")
    assert env.wait(r.json()["job_id"])["state"] == "succeeded"
    return r.json()["id"]


def test_a_batch_that_could_outgrow_the_response_limit_is_refused_naming_it(tmp_path):
    limit_mb = 0.01
    each = record_bytes_bound(16, "float16", arrow=False)  # the fake's vectors: 16 float16 values
    fits = int(limit_mb * 2**20) // each
    app, fake = _env(tmp_path, max_response_mb=limit_mb)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        ck = _ready(env)
        ids = [f"p{i:02d}" for i in range(fits + 1)]
        r = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": ids})
        assert r.status_code == 413, r.text
        message = r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "response_too_large"
        assert f"limit of {limit_mb:g} MB (max_response_mb)" in message and f"at most {fits} prompt ids" in message
        ok = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": ids[:fits]})
        assert ok.status_code == 200 and len(ok.json()["items"]) == fits
        assert len(ok.content) <= limit_mb * 2**20  # the bound holds for what was actually sent


def test_batches_beyond_the_heavy_slots_wait_then_get_429_while_single_lookups_go_on(tmp_path):
    app, fake = _env(tmp_path, heavy_requests=1, heavy_wait_s=0.2)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        ck = _ready(env)
        svc = app.state.service
        assert svc.heavy.try_acquire()  # one batch being served
        try:
            t = time.monotonic()
            r = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": ["p01", "p02"]})
            assert r.status_code == 429 and r.headers["Retry-After"] == "1"
            assert time.monotonic() - t >= 0.2 and "heavy_requests" in r.json()["error"]["message"]
            assert env.get(f"/v1/checkpoints/{ck}/gradients/p01").status_code == 200
        finally:
            svc.heavy.release()
        r = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": ["p01", "p02"]})
        assert r.status_code == 200


def test_designed_refusals_are_logged_below_error(tmp_path, caplog):
    """A refusal by design is no fault: a caller's 429 is logged at info, the server's 503 at warning, whether
    the route refused (the error handler) or the admission check did (middleware); level error stays empty."""
    app, fake = _env(tmp_path, heavy_requests=1, heavy_wait_s=0.1)
    caplog.set_level(logging.DEBUG, logger="cropi_service")
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        ck = _ready(env)
        svc, batch = app.state.service, f"/v1/checkpoints/{ck}/gradients:batch"
        caplog.clear()
        assert svc.heavy.try_acquire()  # one batch being made: the next waits its time, then 429
        try:
            assert env.post(batch, json={"prompt_ids": ["p01"]}).status_code == 429
        finally:
            svc.heavy.release()
        ledger = svc.answers
        held = ledger.reserve("someone else", ledger.max_bytes - 1, check=False)
        try:  # admitted (the server is not quite full), then the batch's own reservation is refused: 503
            r = env.post(batch, json={"prompt_ids": ["p01"]})
            assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
            held.resize(ledger.max_bytes)  # full: the admission check refuses any request
            assert env.get("/v1/datasets").status_code == 503
        finally:
            held.release()
    mine = [r for r in caplog.records if r.name.startswith("cropi_service")]
    assert not [r for r in mine if r.levelno >= logging.ERROR], [r.getMessage() for r in mine]
    refused = [(r.levelno, r.status, r.path) for r in mine if r.getMessage() == "request refused"]
    assert refused == [(logging.INFO, 429, batch), (logging.WARNING, 503, batch),
                       (logging.WARNING, 503, "/v1/datasets")]
    messages = [r.error for r in mine if r.getMessage() == "request refused"]  # what was refused, and why
    assert "heavy_requests" in messages[0] and all("answer_memory_mb" in m for m in messages[1:])


def test_metrics_answer_while_the_admission_check_refuses_other_requests(tmp_path):
    """A scrape is what the operator needs when the answers in flight fill the server: /metrics, like
    /healthz, is never refused for their memory (it still needs the token)."""
    app, fake = _env(tmp_path)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        ledger = app.state.service.answers
        held = ledger.reserve("someone else", ledger.max_bytes, check=False)
        try:
            r = env.get("/v1/datasets")
            assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
            metrics = env.get("/metrics")
            assert metrics.status_code == 200 and "cropi_" in metrics.text
            assert client.get("/metrics").status_code == 401
            assert client.get("/healthz").status_code == 200
        finally:
            held.release()
        assert env.get("/v1/datasets").status_code == 200


def test_three_splits_cycled_through_the_service_read_only_the_asked_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(shard_io, "PART_BYTES", 4096)  # several record batches a shard
    dim = 512
    for c in range(3):
        split = open_split(tmp_path / "store", dtype="float16", spec=SPEC | {"dim": dim}, dim=dim,
                           checkpoint=CheckpointRef(name=f"ck{c}", fingerprint=f"fp{c}"))
        write_grads(split, "w0", [f"p{i:03d}" for i in range(90)], rows_per_shard=30, salt=str(c))
    whole, parts = [], []
    real_whole, real_part = shard_io.read_verified, shard_io.read_part
    monkeypatch.setattr(shard_io, "read_verified", lambda *a: whole.append(a[3]) or real_whole(*a))
    monkeypatch.setattr(shard_io, "read_part", lambda *a: parts.append(a[4]) or real_part(*a))
    library = CropiLibrary(tmp_path, part_cache_bytes=1 << 20)  # the server's one budget, all splits
    views = [GradientView(library.gradients(f"ck{c}", SPEC["spec_id"], "pool")) for c in range(3)]
    for _ in range(20):  # the attack: lookups cycling over three checkpoints
        for c, view in enumerate(views):
            body = view.records_json(["p007", "p061"])
            want = np.asarray(grad_row("p061", dim, str(c))["vector"]).astype(np.float16)
            assert body.endswith((",".join(repr(float(x)) for x in want) + "]}]").encode())
    assert whole == []  # no shard, let alone a split, read whole
    assert len(parts) == 6  # two record batches of each split, once each
    assert library.parts.bytes <= library.parts.max_bytes


def test_a_flood_of_jobs_is_answered_429_past_the_limit_while_another_callers_job_goes_in(tmp_path):
    app, fake = _env(tmp_path, token=f"{TOKEN}\n{OTHER}", workers=0, max_queued_per_caller=3, max_queued=10)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        codes = [env.checkpoint(f"flood{i}").status_code for i in range(5)]
        assert codes == [202, 202, 202, 429, 429]
        r = env.checkpoint("flood9")
        assert r.status_code == 429 and r.headers["Retry-After"] == "30"
        assert "max_queued_per_caller" in r.json()["error"]["message"]
        other = {"Authorization": f"Bearer {OTHER}"}
        body = {"name": "theirs", "path": str(tmp_path / "data" / "model"), "pool": env.ids["pool"],
                "validation": [env.ids["gsm"]]}
        env.release("theirs")
        theirs = client.post("/v1/checkpoints", json=body, headers=other)
        assert theirs.status_code == 202, theirs.text
        # fair order: the other caller's one job runs before the flooder's second
        jobs = JobStore(make_settings(tmp_path).db_path)
        first = jobs.claim("r", 3)
        second = jobs.claim("r", 3)
        assert first.caller == caller_of(TOKEN.encode()) and second.id == theirs.json()["job_id"]


def test_the_overall_queue_limit_holds_across_callers(tmp_path):
    jobs = JobStore(tmp_path / "jobs.sqlite")
    limits = QueueLimits(per_caller=5, total=4)
    for i in range(4):
        jobs.create("k", "t", {}, caller=f"c{i}", limits=limits)
    with pytest.raises(Exception, match="the job queue is full \\(4 queued, max_queued\\)"):
        jobs.create("k", "t", {}, caller="c9", limits=limits)


def test_a_second_runner_on_a_root_is_refused_and_a_stop_requeues_only_its_own_jobs(tmp_path):
    settings = make_settings(tmp_path, workers=1, runner_name="service")
    jobs = JobStore(settings.db_path)
    first = Runner(settings, jobs, dict(KINDS))
    first.start()
    try:
        second = Runner(settings, JobStore(settings.db_path), dict(KINDS))
        with pytest.raises(ServiceConfigError, match=r"already holds the name 'service'.*pid \d+"):
            second.start()
        with pytest.raises(ServiceConfigError, match="already holds the name 'service'"):
            with TestClient(create_app(settings, library=FakeLibrary(tmp_path), kinds=KINDS)):
                pass  # a second server on the root: refused at start
        theirs = jobs.create("scoring", "x:y", {})
        with jobs_claimed(jobs, "elsewhere") as claimed:  # a job another runner is running
            assert claimed.id == theirs.id
            other = Runner(make_settings(tmp_path, workers=1, runner_name="other"), JobStore(settings.db_path),
                           dict(KINDS))
            other.start()
            other.stop()
            assert jobs.get(theirs.id).state == "running" and jobs.get(theirs.id).owner == "elsewhere"
    finally:
        first.stop()
    again = Runner(settings, JobStore(settings.db_path), dict(KINDS))
    again.start()  # the name is free once its holder stopped
    again.stop()


class jobs_claimed:
    def __init__(self, jobs: JobStore, owner: str):
        self.jobs, self.owner = jobs, owner

    def __enter__(self):
        return self.jobs.claim(self.owner, 3)

    def __exit__(self, *exc):
        return False


def test_more_than_one_authorization_header_is_refused_on_the_fast_and_the_full_path(tmp_path):
    app, fake = _env(tmp_path, version_ttl_s=60)
    fake.version = 1  # a stored stamp (0 reads as "no file"): a loaded page is then served without the route
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        ck = _ready(env)
        page = f"/v1/checkpoints/{ck}/ranking?limit=5"
        assert env.get(page).status_code == 200  # loaded: the next plain read is a fast-path read
        assert app.state.service.ranking_page(ck, 0, 5, None, peek=True)  # in memory: served without the route
        good, bad = AUTH["Authorization"], "Bearer wrong"
        for headers in ([("Authorization", bad), ("Authorization", good)], [("Authorization", good)] * 2):
            for url in (page, f"/v1/checkpoints/{ck}", f"/v1/checkpoints/{ck}/gradients/p01"):
                r = client.get(url, headers=headers)
                assert r.status_code == 401 and "2 Authorization headers" in r.json()["error"]["message"], url


def test_registrations_past_the_bound_are_answered_at_once(tmp_path):
    app, fake = _env(tmp_path, max_registrations=1)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        svc = app.state.service
        assert svc._registrations.acquire()  # one large prompt file being read
        try:
            path = tmp_path / "data" / "big.jsonl"
            path.write_text('{"prompt_id": "a", "prompt": "q", "answer": "1"}\n')
            t = time.monotonic()
            r = env.post("/v1/datasets", json={"name": "big", "path": str(path), "kind": "pool"})
            assert r.status_code == 429 and time.monotonic() - t < 1 and r.headers["Retry-After"] == "5"
            assert "max_registrations" in r.json()["error"]["message"]
        finally:
            svc._registrations.release()
        assert env.post("/v1/datasets", json={"name": "big", "path": str(path), "kind": "pool"}).status_code == 201
