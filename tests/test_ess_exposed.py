"""ESS where a user sees it: `cropi refresh` (and the refresh job file), `cropi rank`'s rows, and
the service's gradient endpoint (JSON and Arrow), against the values in the store."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient


from cropi.cli import main
from cropi.contracts import GRADIENT_META_COLUMNS, GRADIENT_OPTIONAL_COLUMNS
from cropi.demo.assets import shipped_model
from cropi.store import CheckpointRef, GradientStore, TrajectoryStore
from cropi.store.sharded import ShardedDataset
from cropi.store.types import gradient_schema, legacy_schema
from cropi_service.api.app import create_app
from cropi.pipeline.requests import store_path
from cropi_service.domain.library import CropiLibrary
from support.refresh import SPEC, make_inputs
from support.service import ARROW, JOBS, Env, make_settings, read_arrow

ESS = [0.9, 0.1, 0.45, None, 0.3, 0.6, 0.05, 0.2, 1.0, 0.7]
CHOSEN = (6, 1, 7)  # below 0.5, lowest first, floor(0.3 * 10) = 3


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def refresh_args(tmp_path, *extra: str) -> list[str]:
    return ["refresh", "--model", str(shipped_model()), "--prompts", str(tmp_path / "pool.jsonl"),
            "--store", str(tmp_path / "grads"), "--name", "ck", "--out", str(tmp_path / "refresh"),
            "--backend", "hf", "--reward", "exact_numeric", "--samples", "2", "--max-new-tokens", "4",
            "--batch-prompts", "1", *extra]


# cropi refresh

def test_cli_refresh_recollects_exactly_the_chosen_prompts(tmp_path):
    records = make_inputs(tmp_path, ESS)
    want = [records[i].prompt_id for i in CHOSEN]
    # no --spec-id (the checkpoint has one spec) and no --split (the pool): both found
    code, out, err = cli(*refresh_args(tmp_path, "--below", "0.5", "--budget", "0.3", "--json"))
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["selected"] == want and summary["chosen"] == 3
    assert summary["below"] == 0.5 and summary["budget"] == 0.3 and summary["pool_size"] == 10
    assert summary["spec_id"] == SPEC["spec_id"] and summary["split"] == "pool" and summary["checkpoint"] == "ck"
    assert summary["collected"] == 3 and summary["skipped"] == 0
    got = list(TrajectoryStore.open(str(tmp_path / "refresh" / "trajectories")).iter_prompts())
    assert sorted(t.prompt_id for t in got) == sorted(want) and all(len(t.responses) == 2 for t in got)
    plan = json.loads((tmp_path / "refresh" / "plan.json").read_text())
    assert plan["selected"] == want and plan["spec_id"] == SPEC["spec_id"]

    # the same refresh as a job file: resumes the frozen plan, collects nothing more
    job = {"kind": "refresh", "job": {"model": str(shipped_model()), "prompts": str(tmp_path / "pool.jsonl"),
                                      "gradients": str(tmp_path / "grads"), "checkpoint": "ck",
                                      "out": str(tmp_path / "refresh"), "below": 0.5, "budget": 0.3,
                                      "backend": "hf", "reward": "exact_numeric", "batch_prompts": 1,
                                      "sampling": {"samples": 2, "max_new_tokens": 4}}}
    (tmp_path / "refresh.json").write_text(json.dumps(job))
    code, out, err = cli("job", str(tmp_path / "refresh.json"), "--json")
    assert code == 0, err
    again = json.loads(out.strip().splitlines()[-1])
    assert again["selected"] == want and again["collected"] == 0 and again["skipped"] == 3


def test_cli_refresh_bad_arguments_exit_with_a_clear_error(tmp_path):
    make_inputs(tmp_path, ESS)
    out = tmp_path / "refresh"
    # out of range: the options model's bound, named by its flag; nothing is written
    code, _, err = cli(*refresh_args(tmp_path, "--below", "0.5", "--budget", "1.5"))
    assert code == 2 and "cropi refresh: error: --budget" in err and "less than or equal to 1" in err
    assert not out.exists()
    # a spec the store does not have
    code, _, err = cli(*refresh_args(tmp_path, "--below", "0.5", "--budget", "0.3", "--spec-id", "nope"))
    assert code == 2 and "nope" in err and SPEC["spec_id"] in err  # names the specs present
    assert not (out / "plan.json").exists()
    # a resumed refresh with another threshold is refused (the plan is frozen)
    assert cli(*refresh_args(tmp_path, "--below", "0.05", "--budget", "0.3"))[0] == 0  # nothing below: no collect
    code, _, err = cli(*refresh_args(tmp_path, "--below", "0.5", "--budget", "0.3"))
    assert code == 2 and "other settings (below)" in err
    # the ESS criterion's threshold left out: a usage error that names it
    code, _, err = cli("refresh", "--model", "m", "--prompts", "p", "--store", "s", "--name", "ck", "--out", "o",
                       "--budget", "0.3")
    assert code == 2 and "criterion 'ess' needs --below" in err


# cropi rank rows carry the pool's ESS

def test_cli_rank_rows_carry_the_stored_ess(tmp_path):
    store = GradientStore(str(tmp_path / "grads"))
    rng = np.random.default_rng(0)
    ess = {f"p{i}": (None if i == 2 else (i + 1) / 8) for i in range(6)}
    with store.split(CheckpointRef(name="ck", fingerprint="f"), SPEC, "pool", dim=4, dtype="float32").writer("w") as w:
        for p, e in ess.items():
            w.append(p, rng.normal(size=4), 1.0, 8, 0.5, 0.5, 20, "ok", ess=None if e is None else 8 * e,
                     ess_fraction=e)
    with store.split(CheckpointRef(name="ck", fingerprint="f"), SPEC, "val", dim=4, dtype="float32").writer("w") as w:
        for i in range(3):
            w.append(f"v{i}", rng.normal(size=4), 1.0, 8, 0.5, 0.5, 20, "ok")
    code, out, err = cli("rank", "--store", str(tmp_path / "grads"), "--name", "ck", "--validation", "val", "--json")
    assert code == 0, err
    rows = json.loads(out.strip().splitlines()[-1])["rows"]
    assert sorted(r["prompt_id"] for r in rows) == sorted(ess)
    for r in rows:
        e = ess[r["prompt_id"]]
        assert r["ess_fraction"] == e and r["ess"] == (None if e is None else 8 * e)
    code, out, err = cli("rank", "--store", str(tmp_path / "grads"), "--name", "ck", "--validation", "val")
    # the printed table ends with the diagnostics the split was stored with
    assert code == 0 and out.splitlines()[0].split("\t")[-3:] == ["ess_fraction", "p_theta", "std_theta"]


# the service's gradient endpoint

def write_legacy_split(store: GradientStore, spec: dict, split: str, ids: list[str]) -> None:
    """A split as stored before the ESS columns existed (as tests/test_ess.py builds one)."""
    identity = {"kind": "gradients", "checkpoint": CheckpointRef(name="ck", fingerprint="f").model_dump(),
                "spec": spec, "split": split, "dim": 4, "dtype": "float32", "extra": {}}
    old = ShardedDataset(store._dir("ck", spec["spec_id"], split), identity, "ipc",
                         legacy_schema(gradient_schema(4, "float32")), filesystem=store.fs)
    n = len(ids)
    old.writer("w0").commit(pa.table({
        "prompt_id": ids, "vector": pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32(), 4)),
        "raw_norm": [1.0] * n, "n_responses": pa.array([8] * n, pa.int32()), "reward_mean": [0.5] * n,
        "reward_std": [0.5] * n, "n_tokens": [9] * n, "status": ["ok"] * n}))


def test_service_gradients_serve_the_stored_ess(tmp_path):
    (tmp_path / "data" / "model").mkdir(parents=True)
    settings = make_settings(tmp_path)
    app = create_app(settings, library=CropiLibrary(settings.root),
                     kinds={"scoring": f"{JOBS}:instant_job", "curriculum": f"{JOBS}:instant_job"})
    with TestClient(app) as client:
        env = Env(tmp_path, client, None)
        r = env.checkpoint("ck", release=False)
        assert r.status_code == 202, r.text
        assert env.wait(r.json()["job_id"])["state"] == "succeeded"
        ck = r.json()["id"]
        spec_id = env.get(f"/v1/checkpoints/{ck}").json()["spec_id"]
        spec = {**SPEC, "spec_id": spec_id}
        store = GradientStore(store_path(settings.root))
        ess = {"a": 0.25, "b": None, "c": 1.0, "d": 0.125}
        with store.split(CheckpointRef(name="ck", fingerprint="f"), spec, "pool", dim=4, dtype="float32").writer("w") as w:
            for i, (p, e) in enumerate(ess.items()):
                w.append(p, np.full(4, float(i)), 1.0, 8, 0.5, 0.5, 20, "ok",
                         ess=None if e is None else 8 * e, ess_fraction=e)
        write_legacy_split(store, spec, "gsm", ["g0", "g1"])
        stored = store.open_split("ck", spec_id, "pool").read()
        row = {p: i for i, p in enumerate(stored.prompt_ids)}

        want = ["d", "b", "a", "c"]
        body = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": want}).json()
        assert [it["prompt_id"] for it in body["items"]] == want
        for it in body["items"]:
            e, k = stored.ess[row[it["prompt_id"]]], stored.ess_fraction[row[it["prompt_id"]]]
            assert (it["ess"] is None) if math.isnan(e) else it["ess"] == e
            assert (it["ess_fraction"] is None) if math.isnan(k) else it["ess_fraction"] == k
            assert it["ess_fraction"] == ess[it["prompt_id"]]  # and what was written
            assert it["status"] == "ok" and it["n_responses"] == 8 and len(it["vector"]) == 4  # old fields kept
        one = env.get(f"/v1/checkpoints/{ck}/gradients/a").json()["items"][0]
        assert one["ess"] == 2.0 and one["ess_fraction"] == 0.25

        table = read_arrow(env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": want},
                                    headers={"Accept": ARROW}).content)
        assert table["ess_fraction"].to_pylist() == [ess[p] for p in want]
        assert table["ess"].to_pylist() == [None if ess[p] is None else 8 * ess[p] for p in want]
        assert table.schema.field("ess").type == "double" and table["status"].to_pylist() == ["ok"] * 4

        # a split stored without ESS: null in JSON, no column in Arrow
        old = env.post(f"/v1/checkpoints/{ck}/gradients:batch", json={"prompt_ids": ["g1", "g0"], "split": "gsm"})
        assert old.status_code == 200, old.text
        assert [(it["prompt_id"], it["ess"], it["ess_fraction"]) for it in old.json()["items"]] == [
            ("g1", None, None), ("g0", None, None)]
        old_arrow = read_arrow(env.post(f"/v1/checkpoints/{ck}/gradients:batch",
                                        json={"prompt_ids": ["g0"], "split": "gsm"}, headers={"Accept": ARROW}).content)
        assert "ess" not in old_arrow.column_names and "ess_fraction" not in old_arrow.column_names

        # the documented response schema names both fields
        schema = env.get("/openapi.json").json()["components"]["schemas"]["GradientRecord"]["properties"]
        assert {"ess", "ess_fraction"} <= set(schema)
        # ... and every field a record carries, each with its description
        returned = set(body["items"][0])
        assert returned == set(GRADIENT_META_COLUMNS) | set(GRADIENT_OPTIONAL_COLUMNS) | {"prompt_id", "vector"}
        assert returned <= set(schema), returned - set(schema)
        assert all(schema[c].get("description") for c in GRADIENT_OPTIONAL_COLUMNS)


def test_refresh_flags_show_their_defaults_and_reuse_the_collect_job_s():
    from cropi.cli import build_parser
    from cropi.pipeline.collect import CollectJob
    from cropi.pipeline.refresh import RefreshJob

    sub = build_parser()._subparsers._group_actions[0].choices["refresh"]
    for action in sub._actions:
        if action.option_strings and action.dest not in ("help", "json") and not action.required:
            assert action.help and "(default: " in action.help, action.option_strings
            assert action.default is argparse.SUPPRESS  # the model applies its own default
    for name in ("sampling", "backend", "reward", "batch_prompts", "engine"):
        assert RefreshJob.model_fields[name].default == CollectJob.model_fields[name].default, name
    required = {a.dest for a in sub._actions if a.required}
    # --below is required by the ESS criterion only (the model says so: see the bad-arguments test)
    assert required == {"model", "prompts", "gradients", "checkpoint", "out", "budget"}
