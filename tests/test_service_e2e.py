"""End to end: the real server as a subprocess over the real pipeline, killed mid-job.

A tiny model warm-started on the test's prompts, arithmetic prompt sets and their
trajectories (collected with the transformers backend) are prepared once. The library scores them directly (the
uninterrupted reference run); the service scores the same inputs, is SIGKILLed while the
gradients are being computed, is started again, resumes the job, and must then serve the
reference ranking and the reference vectors, as JSON and as Arrow.

Needs cropi.pipeline.score (skipped without it). Slow: minutes on 2 CPU cores.
"""

from __future__ import annotations

import subprocess
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytestmark = pytest.mark.slow


from support.service_e2e import (ARROW, SPLITS, world, reference, Server, _worker_pid, finished,
                                gone, submit_scoring)


def test_a_killed_server_resumes_scoring_and_serves_the_reference_results(world, reference, tmp_path):
    server = Server(tmp_path / "root", world["data"], tmp_path / "server.log")
    server.start()
    try:
        with server.client() as c:
            ck, job_id = submit_scoring(c, world)
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
        assert gone(worker_pid), "the worker outlived its server"

        server.start()
        with server.client() as c:
            job = finished(c, job_id)
            assert job["state"] == "succeeded", job
            assert job["attempts"] == 2  # resumed once, not restarted from a fresh submission
            _check_ranking(c, ck, reference)
            _check_gradients(c, ck, reference)
            metrics = c.get("/metrics").text
            assert f"cropi_prompts_scored_total {float(SPLITS['pool'])}" in metrics
    finally:
        server.stop()


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
    # the selection's mix against the pool, as the library stored it with the ranking
    assert page["selection"] == reference["ranking"].meta["selection"] and page["selection"]["n"] > 0


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
