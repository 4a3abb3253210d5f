"""Gradient-store helpers shared by the store tests: a split opened with a fixed identity, and rows
that are a pure function of the prompt id (so runs can be compared)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from cropi.store import GRADIENT_STATUSES, CheckpointRef, GradientStore

DIM = 16
CKPT = CheckpointRef(name="ckpt-1", fingerprint="fp-aaaa")
SPEC = {"kind": "sjlt", "dim": DIM, "seed": 0, "spec_id": "spec0"}


def open_split(root, dtype="float32", spec=SPEC, checkpoint=CKPT, split="pool", dim=DIM):
    return GradientStore(str(root)).split(checkpoint, spec, split, dim=dim, dtype=dtype,
                                          extra={"loss": {"clip_eps": None}})


def grad_row(pid: str, dim: int = DIM, salt: str = "") -> dict:
    """A gradient row that is a pure function of the prompt id (so runs can be compared)."""
    rng = np.random.default_rng(int(hashlib.sha256((salt + pid).encode()).hexdigest()[:12], 16))
    return dict(prompt_id=pid, vector=rng.standard_normal(dim), raw_norm=float(rng.exponential()),
                n_responses=int(rng.integers(1, 9)), reward_mean=float(rng.random()),
                reward_std=float(rng.random()), n_tokens=int(rng.integers(1, 10**6)),
                status=GRADIENT_STATUSES[int(rng.integers(0, len(GRADIENT_STATUSES)))])


def write_grads(split, writer_id, pids, rows_per_shard=4, salt=""):
    """Write the gradients of ``pids`` this split lacks (a resumable job in miniature)."""
    done = split.committed_prompt_ids()
    with split.writer(writer_id, rows_per_shard=rows_per_shard) as w:
        for pid in pids:
            if pid not in done:
                w.append(**grad_row(pid, split.dim, salt))


def snapshot(root: str | Path) -> dict[str, str]:
    """Every file under ``root`` with its sha256: to show an operation left a store as it was."""
    root = Path(root)
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}
