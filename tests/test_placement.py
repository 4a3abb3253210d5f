"""Ray placement has one set of defaults (cropi.pipeline.distribute.RayPlacement): a job file's
``"ray"`` and the CLI's ``--ray`` place workers alike; on a GPU cluster each worker gets a GPU unless
told otherwise (a job file once ran its workers with none)."""

from __future__ import annotations

import json

import pytest

from cropi.pipeline import distribute
from cropi.pipeline.distribute import RayPlacement
from cropi.pipeline.jobfile import load_job_file, run_job_file
from support.cli import run_cli

JOB = {"model": "m", "trajectories": "t", "store": "s", "split": "pool"}


@pytest.fixture
def placements(monkeypatch) -> list[RayPlacement]:
    """What run_sharded is handed, with Ray itself left out."""
    seen: list[RayPlacement] = []

    def fake(fn, job, placement=None, **kwargs):
        seen.append(placement or RayPlacement())
        return []

    monkeypatch.setattr(distribute, "run_sharded", fake)
    return seen


def test_a_job_file_and_the_cli_place_workers_with_one_default(tmp_path, placements):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"kind": "gradients", "job": JOB, "ray": {"address": "local"}}))
    run_job_file(load_job_file(path))
    run_cli("gradients", *(f"--{k}={v}" for k, v in JOB.items()), "--ray", "local")
    from_file, from_cli = placements
    assert from_file == from_cli == RayPlacement()
    for placement in (from_file, from_cli):
        assert placement.gpus({"GPU": 8.0, "CPU": 64.0}) == 1.0  # a GPU cluster: one a worker
        assert placement.gpus({"CPU": 64.0}) == 0.0


def test_a_named_gpu_count_is_kept_and_a_negative_one_refused(tmp_path, placements):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"kind": "gradients", "job": JOB, "ray": {"gpus_per_worker": 0.5, "workers": 3}}))
    run_job_file(load_job_file(path))
    run_cli("gradients", *(f"--{k}={v}" for k, v in JOB.items()), "--ray", "local", "--gpus-per-worker", "0",
            "--workers", "3")
    from_file, from_cli = placements
    assert from_file.gpus({"GPU": 8.0}) == 0.5 and from_cli.gpus({"GPU": 8.0}) == 0.0
    assert from_file.workers == from_cli.workers == 3
    with pytest.raises(ValueError, match="gpus_per_worker"):
        RayPlacement(gpus_per_worker=-1)
