"""A hostile caller: every request body is a closed schema with bounds, so nothing a caller sends
chooses the model that is loaded, loads code, or reaches an engine, loader or shell as a raw dict.

Each attack is refused with a 422 naming the field, and the service's stored state (its tables
and the files under its root) is unchanged afterwards.
"""

from __future__ import annotations

import json
import sqlite3

import pytest


from cropi_service.options.params import curriculum_config, scoring_request
from support.service import AUTH, stored, svc


SCORING_ATTACKS = [
    ({"options": {"collect": {"backend_options": {"trust_remote_code": True}}}}, "options.collect.backend_options"),
    ({"options": {"collect": {"backend_options": {"model": "/elsewhere"}}}}, "options.collect.backend_options"),
    ({"options": {"model": "/elsewhere"}}, "options.model"),
    ({"options": {"collect": {"engine": {"trust_remote_code": True}}}}, "options.collect.engine.trust_remote_code"),
    ({"options": {"collect": {"engine": {"model": "/elsewhere"}}}}, "options.collect.engine.model"),
    ({"options": {"collect": {"engine": {"tokenizer": "/elsewhere"}}}}, "options.collect.engine.tokenizer"),
    ({"options": {"collect": {"backend": "hf", "engine": {"attn_implementation": "kernels-community/flash"}}}},
     "options.collect.engine.attn_implementation"),
    ({"options": {"collect": {"backend": "hf", "engine": {"max_model_len": 64}}}}, "options.collect"),
    ({"options": {"collect": {"reward": "os.system"}}}, "options.collect.reward"),
    ({"options": {"collect": {"pool_samples": 10**9}}}, "options.collect.pool_samples"),
    ({"options": {"collect": {"max_new_tokens": 10**9}}}, "options.collect.max_new_tokens"),
    ({"options": {"behavior": "/elsewhere"}}, "options.behavior"),
    ({"options": {"top_fraction": 2.0}}, "options.top_fraction"),
    ({"options": {"loss": {"token_budget": 10**12}}}, "options.loss.token_budget"),
    ({"projection": {"dim": 10**12}}, "projection.dim"),
    ({"projection": {"kind": "sjlt", "device": "cuda"}}, "projection.device"),
    ({"trajectories": {"pool": "x" * 5000}}, "trajectories.pool"),
    ({"path": "m" * 5000}, "path"),
]


@pytest.mark.parametrize("attack,field", SCORING_ATTACKS, ids=[f for _, f in SCORING_ATTACKS])
def test_checkpoint_attacks_are_refused_naming_the_field(svc, attack, field):
    client, ids, settings = svc
    before = stored(settings)
    body = {"name": "ck", "path": "model", "pool": ids["pool"], "validation": [ids["gsm"]], **attack}
    r = client.post("/v1/checkpoints", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "validation_error"
    assert field in r.json()["error"]["message"], r.json()
    assert stored(settings) == before


CURRICULUM_ATTACKS = [
    ({"options": {"model": "/elsewhere"}}, "options.model"),
    ({"options": {"trainer_options": {"python": "/bin/sh"}}}, "options.trainer_options"),
    ({"options": {"trainer": {"name": "verl", "python": "/bin/sh"}}}, "options.trainer.verl.python"),
    ({"options": {"trainer": {"name": "verl", "extra_overrides": ["actor_rollout_ref.model.path=/elsewhere"]}}},
     "options.trainer.verl.extra_overrides"),
    ({"options": {"trainer": {"name": "verl", "run_dir": "/elsewhere"}}}, "options.trainer.verl.run_dir"),
    ({"options": {"trainer": {"name": "verl", "loggers": ["wandb"]}}}, "options.trainer.verl.loggers"),
    ({"options": {"trainer": {"name": "trl", "trust_remote_code": True}}}, "options.trainer.trl.trust_remote_code"),
    ({"options": {"trainer": {"name": "custom"}}}, "options.trainer"),
    ({"options": {"collect": {"backend_options": {"trust_remote_code": True}}}}, "options.collect.backend_options"),
    ({"options": {"collect": {"pool_samples": 10**6}}}, "options.collect.pool_samples"),
    ({"options": {"device": "cuda:0; rm -rf /"}}, "options.device"),
    ({"options": {"trainer": {"name": "trl", "rollouts": 10**6}}}, "options.trainer.trl.rollouts"),
]


@pytest.mark.parametrize("attack,field", CURRICULUM_ATTACKS, ids=[f for _, f in CURRICULUM_ATTACKS])
def test_curriculum_attacks_are_refused_naming_the_field(svc, attack, field):
    client, ids, settings = svc
    before = stored(settings)
    body = {"name": "cur", "path": "model", "pool": ids["pool"], "validation": [ids["gsm"]], **attack}
    r = client.post("/v1/curricula", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]["message"], r.json()
    assert stored(settings) == before


def test_the_library_request_is_built_from_named_fields_only(svc):
    """A job's stored parameters become the library request: the model is the registered folder and
    the engine gets exactly the named options the caller chose; an edited job row is refused."""
    client, ids, settings = svc
    (settings.root.parent / "release").mkdir()
    body = {"name": "ck", "path": "model", "pool": ids["pool"], "validation": [ids["gsm"]],
            "projection": {"dim": 64}, "options": {"top_fraction": 0.5, "collect": {
                "backend": "vllm", "temperature": 1.0,
                "engine": {"max_model_len": 512}}}}
    r = client.post("/v1/checkpoints", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    job = client.get(f"/v1/jobs/{r.json()['job_id']}", headers=AUTH).json()
    with sqlite3.connect(settings.db_path) as conn:
        params = json.loads(conn.execute("SELECT params FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0])
    request = scoring_request(params)
    assert request.model == str((settings.root.parent / "data" / "model").resolve())
    assert request.collect.engine.model_dump(exclude_none=True) == {"max_model_len": 512}
    assert request.collect.temperature == 1.0
    assert request.collect.pool_samples == 8 and request.collect.validation_samples == 32  # library defaults kept
    assert request.projection.dim == 64 and request.select_fraction == 0.5
    for tampered in ({**params, "options": {"collect": {"backend_options": {"trust_remote_code": True}}}},
                     {**params, "trust_remote_code": True},
                     {**params, "options": {"collect": {"engine": {"model": "/elsewhere"}}}}):
        with pytest.raises(ValueError, match="Extra inputs are not permitted"):
            scoring_request(tampered)
    (settings.root.parent / "release" / "ck").touch()


def test_curriculum_trainer_options_are_closed_per_trainer(tmp_path):
    (tmp_path / "m").mkdir()
    for f in ("p.jsonl", "g.jsonl"):
        (tmp_path / f).write_text("{}\n")
    params = {"roots": [str(tmp_path)], "name": "cur", "model": str(tmp_path / "m"), "pool": str(tmp_path / "p.jsonl"),
              "validation": {"gsm": str(tmp_path / "g.jsonl")}, "stages": 2,
              "fraction": 0.2, "options": {"trainer": {"name": "trl", "lr": 1e-5, "micro_batch": 4},
                                           "collect": {"backend": "hf", "engine": {"max_batch_rows": 64}}}}
    config = curriculum_config(params)
    assert config.trainer == "trl" and config.trainer_options == {"lr": 1e-5, "micro_batch": 4}
    assert config.collect.engine.max_batch_rows == 64 and config.select_fraction == 0.2
    with pytest.raises(ValueError, match="python"):
        curriculum_config({**params, "options": {"trainer": {"name": "verl", "python": "/bin/sh"}}})
