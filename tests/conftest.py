"""Fixtures shared across test modules: a task model with mixed rewards and small prompt files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def task_model() -> str:
    """The shipped warm-started tiny model: its pass rate on the task is neither 0 nor 1,
    so groups of responses carry signal (a random-init model gets every reward 0)."""
    from cropi.demo.assets import shipped_model

    return str(shipped_model())


@pytest.fixture(scope="session")
def task_files(tmp_path_factory) -> dict[str, str]:
    """Pool (verl parquet), val_a (jsonl), val_b (plain parquet): every input format once."""
    from cropi.data.prompts import write_jsonl, write_parquet, write_verl_parquet
    from cropi.tasks.arithmetic import make_task_splits

    d = tmp_path_factory.mktemp("prompts")
    splits = make_task_splits(7, pool_size=200, val_size=40, test_size=10)
    files = {"pool": str(d / "pool.parquet"), "val_a": str(d / "val_a.jsonl"), "val_b": str(d / "val_b.parquet")}
    write_verl_parquet(splits["pool"][:20], files["pool"])
    write_jsonl(splits["val_a"][:8], files["val_a"])
    write_parquet(splits["val_b"][:8], files["val_b"])
    return files


def snapshot(root: str | Path) -> dict[str, str]:
    """Every file under ``root`` with its sha256: to show an operation left a store as it was."""
    root = Path(root)
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}
