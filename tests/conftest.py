"""Fixtures shared across test modules: a task model with mixed rewards and small prompt files."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def brute():
    """Brute-force float64 gradients of support.sketch's two prompts (once a session: the batched kinds' tests
    check every engine, route and layout against them)."""
    from support.gradients import brute_force_grad
    from support.sketch import double_model, two_prompts

    return [dict(brute_force_grad(double_model(), t)) for t in two_prompts()]


@pytest.fixture(scope="session")
def task_splits():
    """Small arithmetic splits: pool 40, val_a 8, val_b 8."""
    from cropi.tasks.arithmetic import make_task_splits

    return make_task_splits(seed=0, pool_size=40, val_size=8, test_size=1)


@pytest.fixture(scope="session")
def task_model(task_splits, tmp_path_factory) -> str:
    """A tiny model warm-started on these very prompts (under a minute on 2 cores) and stopped
    while they are partly learned, so that groups of responses get mixed rewards and carry
    signal: measured (8 samples, T=1), 39 of 40 pool prompts, 7 and 8 of 8 validation prompts,
    mean reward 0.27-0.45. The full 150-step schedule memorises them (every reward 1), and a
    random-init model gets every reward 0: either leaves no validation prompt to score."""
    from cropi.models.warmstart import WarmStartConfig, warm_start

    model = tmp_path_factory.mktemp("task-model") / "model"
    records = task_splits["pool"] + task_splits["val_a"] + task_splits["val_b"]
    warm_start(model, records, WarmStartConfig(steps=150, stop_at=60, seed=0))
    return str(model)


@pytest.fixture(scope="session")
def task_files(task_splits, tmp_path_factory) -> dict[str, str]:
    """Pool (verl parquet), val_a (jsonl), val_b (plain parquet): every input format once."""
    from cropi.data import write_jsonl, write_parquet, write_verl_parquet

    d = tmp_path_factory.mktemp("prompts")
    files = {"pool": str(d / "pool.parquet"), "val_a": str(d / "val_a.jsonl"), "val_b": str(d / "val_b.parquet")}
    write_verl_parquet(task_splits["pool"][:20], files["pool"])
    write_jsonl(task_splits["val_a"], files["val_a"])
    write_parquet(task_splits["val_b"], files["val_b"])
    return files


def pytest_collection_modifyitems(config, items):
    """Tests marked ``vllm`` are skipped, by name, where torch runs its CPU kernels without a vector ISA
    (``ATEN_CPU_CAPABILITY=default``, or a CPU without AVX2) and there is no GPU. vLLM's CPU backend
    needs AVX2 or AVX-512: its sampler's ``torch.compile``d rank kernel does not build there (torch
    2.13's inductor emits ``at::vec`` code with no vector ISA picked; measured: under
    ``ATEN_CPU_CAPABILITY=default`` on an AVX2 machine every vLLM test that samples failed, 10 of
    them). The golden case skips a capability the CPU lacks in the same way."""
    import torch

    if torch.cuda.is_available() or torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        return
    skip = pytest.mark.skip(reason="vLLM's CPU backend needs AVX2 or AVX-512; torch runs at capability "
                                   "default here (ATEN_CPU_CAPABILITY or the CPU)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
