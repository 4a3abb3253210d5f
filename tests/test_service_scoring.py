"""The service's scoring job over the real library, through HTTP: a request that names no projection
is scored with the one default spec (cropi.projection.spec.DEFAULT_SPEC), and a selector other than
the default has its ranking (stored under the selector's name) read back and served; a projection
kind no projector implements is refused naming the known ones.

The golden case's model and prompts (tests/golden), their trajectories collected once; the jobs run
in the service's own worker process. About a minute on 2 cores."""

from __future__ import annotations

import math
import shutil

import pytest
from fastapi.testclient import TestClient

from cropi.data import load_prompts, write_jsonl
from cropi.pipeline.rank import load_ranking
from cropi.pipeline.requests import store_path
from cropi.projection.spec import DEFAULT_SPEC, ProjectionSpec
from cropi.store import GradientStore
from cropi_service.api.app import create_app
from support.golden import COLLECT, GOLDEN, MODEL, cli
from support.service import Env, make_settings, svc  # noqa: F401  (svc: a fixture)

pytestmark = pytest.mark.slow

SPLITS = {"pool": "pool", "val_a": "validation", "val_silent": "validation"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The golden model and prompt files under one data root, with their trajectories; ``val_silent`` is
    ``val_a`` with every answer replaced by a number no response gives (every reward 0: no prompt ok)."""
    data = tmp_path_factory.mktemp("scoring") / "data"
    shutil.copytree(MODEL, data / "model")
    write_jsonl([r.model_copy(update={"answer": "-987654321"}) for r in load_prompts(str(GOLDEN / "val_a.jsonl"))],
                str(data / "val_silent.jsonl"))
    trajectories = {}
    for split in SPLITS:
        if split != "val_silent":
            shutil.copy(GOLDEN / f"{split}.jsonl", data / f"{split}.jsonl")
        trajectories[split] = str(data / "trajectories" / split)
        cli("collect", "--model", str(data / "model"), "--prompts", str(data / f"{split}.jsonl"),
            "--out", trajectories[split], *COLLECT)
    return {"data": data, "trajectories": trajectories}


@pytest.fixture(scope="module")
def service(world, tmp_path_factory):
    """The real service (real library, real job kinds) with the world's prompt sets registered."""
    tmp = tmp_path_factory.mktemp("service")
    settings = make_settings(tmp, data_roots=[world["data"]])
    with TestClient(create_app(settings)) as client:
        env = Env(tmp, client, None)
        for split, kind in SPLITS.items():
            r = env.post("/v1/datasets", json={"name": split, "path": str(world["data"] / f"{split}.jsonl"),
                                               "kind": kind})
            assert r.status_code == 201, r.text
            env.ids[split] = r.json()["id"]
        yield env, settings


def _score(env: Env, world: dict, name: str, validation=("val_a",), state="succeeded", **extra) -> tuple[str, dict]:
    """Submit the checkpoint for scoring and wait for its job: (checkpoint id, the finished job)."""
    body = {"name": name, "path": str(world["data"] / "model"), "pool": env.ids["pool"],
            "validation": [env.ids[v] for v in validation],
            "trajectories": {s: world["trajectories"][s] for s in ("pool", *validation)}, **extra}
    r = env.post("/v1/checkpoints", json=body)
    assert r.status_code == 202, r.text
    job = env.wait(r.json()["job_id"], timeout=600)
    assert job["state"] == state, job
    return r.json()["id"], job


def test_a_silent_validation_set_is_ranked_without_and_warned_of_and_alone_is_refused(service, world):
    """A validation set no response answers has no ok prompt (zero gradient): the ranking is val_a's alone, its
    selection warns naming the silent set; asked alone, the job fails saying why and what to do."""
    env, _ = service
    ck, _ = _score(env, world, "with-silent", validation=("val_a", "val_silent"))
    page = env.get(f"/v1/checkpoints/{ck}/ranking").json()
    [warning] = [w for w in page["selection"]["warnings"] if w["code"] == "silent_validation_set"]
    assert len(warning["sets"]) == 1 and warning["sets"][0] not in warning["ranked_on"]
    assert all(len(it["scores"]) == 1 for it in page["items"])  # one score column: val_a's
    _, job = _score(env, world, "silent-alone", validation=("val_silent",), state="failed")
    assert "no validation set carries a gradient" in str(job), job


def test_a_scoring_request_without_a_projection_is_scored_with_the_default_spec(service, world):
    env, settings = service
    ck, job = _score(env, world, "plain")
    assert job["result"]["spec_id"] == DEFAULT_SPEC.spec_id
    assert env.get(f"/v1/checkpoints/{ck}").json()["spec_id"] == DEFAULT_SPEC.spec_id  # what the service keys on
    page = env.get(f"/v1/checkpoints/{ck}/ranking").json()
    assert page["spec_id"] == DEFAULT_SPEC.spec_id and page["items"]
    stored = GradientStore(store_path(settings.root)).open_split("plain", DEFAULT_SPEC.spec_id, "pool").spec
    assert ProjectionSpec.from_record(stored) == DEFAULT_SPEC  # the vectors themselves: tensorsketch, dim 4096


def test_a_selector_other_than_the_default_is_scored_and_its_ranking_served(service, world):
    env, settings = service
    ck, job = _score(env, world, "by-cropi", options={"selector": "cropi"})
    result = job["result"]
    assert result["ranking"].endswith("/pool.cropi.parquet")
    pool = (world["data"] / "pool.jsonl").read_text().count("\n")
    assert result["prompts_scored"] == pool
    want = load_ranking(store_path(settings.root), "by-cropi", selector="cropi")
    assert want.meta["selector"] == "cropi"
    page = env.get(f"/v1/checkpoints/{ck}/ranking", params={"limit": pool}).json()
    ranked = sorted((r for r in want.table.to_pylist() if r["rank"] > 0), key=lambda r: r["rank"])
    assert [it["prompt_id"] for it in page["items"]] == [r["prompt_id"] for r in ranked]
    chosen = [it["prompt_id"] for it in page["items"] if it["selected"]]
    assert chosen == result["selected"] and 0 < len(chosen) <= math.ceil(0.1 * pool)


def test_an_unknown_projection_kind_is_refused_naming_the_known_ones(svc):
    """At the HTTP edge, before any job: the refusal lists every kind a projection may name."""
    import typing

    from support.service import AUTH, assert_error

    client, ids, _ = svc
    r = client.post("/v1/checkpoints", headers=AUTH, json={
        "name": "ck", "path": "model", "pool": ids["pool"], "validation": [ids["gsm"]],
        "projection": {"kind": "fancy"}})
    assert_error(r, 422, "validation_error")
    message = r.json()["error"]["message"]
    assert "projection.kind" in message
    assert all(k in message for k in typing.get_args(ProjectionSpec.model_fields["kind"].annotation)), message
