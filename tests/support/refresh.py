"""Stored inputs for the refresh tests: a pool's trajectories and gradients with chosen ESS/K."""

from __future__ import annotations

import numpy as np

from cropi.data import write_jsonl
from cropi.demo.assets import task_splits
from cropi.store import CheckpointRef, GradientStore


SPEC = {"kind": "sjlt", "dim": 4, "seed": 0, "spec_id": "s4"}


def make_inputs(tmp_path, ess_fraction):
    records = task_splits()["pool"][:len(ess_fraction)]
    write_jsonl(records, str(tmp_path / "pool.jsonl"))
    split = GradientStore(str(tmp_path / "grads")).split(CheckpointRef(name="ck", fingerprint="f"), SPEC, "pool",
                                                          dim=4, dtype="float32")
    with split.writer("w0") as w:
        for r, e in zip(records, ess_fraction):
            w.append(r.prompt_id, np.ones(4), 1.0, 8, 0.5, 0.5, 20, "ok", ess=None if e is None else 8 * e,
                     ess_fraction=e)
    return records
