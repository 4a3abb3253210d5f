"""The GPU check (benchmarks/gpu/check.py, run by check.sh / `make gpu-checks`) runs end to end here in its
dry-run mode: tiny models of the Qwen2.5 families on CPU, the cuda engine forced onto CPU tensors. It
writes its JSON with every CUDA figure absent, the stages done without error and vLLM / verl skipped with
the reason, so the one try on a GPU machine is not spent finding a broken script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_check_dry_run_writes_its_json_with_the_cuda_figures_absent(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "check.py"), "--dry-run",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((tmp_path / "check_dry_run.json").read_text())
    assert r["dry_run"] is True and r["card"] is None
    for key in ("seconds_per_prompt", "default_over_plain", "k32768_over_plain", "peak_memory_gib_16k",
                "peak_memory_gib_16k_checkpointed", "checkpointed_over_plain"):
        assert r[key] is None, key  # no CUDA figure from a CPU run
    assert r["goal"]["met"] is None and r["dtype"] == "bfloat16" and r["attention"] == "sdpa"
    assert set(r["skipped"]) == {"vllm", "verl"} and all("not run" in why for why in r["skipped"].values())
    assert set(r["stages"]) == {"probe", "memory_16k", "qwen2.5-1.5b", "qwen2.5-7b", "weigh_1.5b", "profile_default"}
    weigh = r["stages"]["weigh_1.5b"]
    assert weigh["seconds_per_group"] is None and weigh["largest_relative_log_mean_weight_gap"] < 0.1
    for name, stage in r["stages"].items():
        assert "error" not in stage and "skipped" not in stage, (name, stage)
    small = r["stages"]["qwen2.5-1.5b"]
    assert small["measured"] is False
    assert set(small["seconds_per_prompt"]) == {"plain", "default", "k32768", "sjlt", "default_checkpointed"}
    assert all(isinstance(v, float) and v > 0 for v in small["seconds_per_prompt"].values())
    assert set(small["routes"]["seconds_per_prompt"]) == {"default_direct", "default_presketch", "default_fft",
                                                          "k32768_direct", "k32768_presketch", "k32768_fft", "plain"}
    varied = small["varied_lengths"]  # padded rows: the masked pass, timed beside plain
    assert set(varied["seconds_per_prompt"]) == {"plain", "default"} and varied["default_over_plain"] > 0
    assert set(r["stages"]["memory_16k"]) >= {"default", "k32768", "default_checkpointed", "plain"}  # plain: the reference at 16k
    profile = r["stages"]["profile_default"]
    assert profile["top_kernels"] and set(profile["host_syncs"]) >= {"aten::item", "cudaStreamSynchronize"}
    assert profile["wall_ms"] > 0 and profile["device_busy_share"] is not None  # no kernels on CPU: 0
    assert r["default_spec"]["spec_id"] and r["default_spec"]["fidelity"]["device"] == "cpu"


def test_the_scatter_benchmark_dry_run_checks_every_candidate_against_float64_sums(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "scatter.py"), "--dry-run",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((tmp_path / "scatter_dry_run.json").read_text())
    assert r["dry_run"] is True and r["cells"]
    for cell in r["cells"]:
        assert set(cell["seconds"]) == set(cell["max_error"])  # every candidate ran and was checked
        assert all(isinstance(s, float) for s in cell["seconds"].values()), cell["seconds"]
        assert all(e < 1e-5 for e in cell["max_error"].values()), cell["max_error"]  # float32 sums of ~100 terms


def _check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu" / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_side_that_fails_is_recorded_and_the_others_still_timed():
    """One try on a GPU: a new side that breaks there (an error, not memory) must not take the stage's other
    figures with it."""
    import torch

    check = _check_module()
    calls = []

    def broken(chunk):
        calls.append(len(chunk))
        raise RuntimeError("recomputed values differ")

    got = check.timed({"plain": lambda chunk: None, "broken": broken}, [1, 2, 3, 4], 2, torch.device("cpu"))
    assert isinstance(got["plain"], float) and got["broken"].startswith("error: RuntimeError: recomputed")
    assert calls == [2]  # not run again after it failed
    record = check.Check.peak(_bare_check(check), broken, [1])
    assert record["peak_gib"].startswith("error: RuntimeError")


def _bare_check(check):
    """A Check instance for its methods that need only the device (no report, no model)."""
    import torch

    c = check.Check.__new__(check.Check)
    c.device = torch.device("cpu")
    return c


def test_the_presketch_refit_recovers_the_side_cost_it_was_built_from():
    """``refit_side`` puts the forced routes' difference on the sketched elements: timings made from the cost
    model with a known ``side`` give that ``side`` back, and the layers that take the presketch at it."""
    import argparse
    import dataclasses

    check = _check_module()
    from cropi.projection import ProjectionSpec, make_projector
    from cropi.projection import tensorsketch as ts

    shapes = {"model.embed_tokens.weight": (151936, 1536), "model.layers.0.self_attn.q_proj.weight": (1536, 1536),
              "model.layers.0.mlp.gate_proj.weight": (8960, 1536), "model.layers.0.mlp.down_proj.weight": (1536, 8960)}
    spec = ProjectionSpec(kind="tensorsketch", dim=4096)
    args = argparse.Namespace(responses=8, prompt_tokens=128, response_tokens=512)
    group = [8 * 640]
    proj = make_projector(spec, shapes)
    wide = [n for n in proj.param_names if proj.presketched_sides(n)]
    assert len(wide) == 3  # the tied output layer (as the embedding's matrix), gate, down; not q
    for side in (2e-12, 3e-11):
        costs = dataclasses.replace(ts.CUDA_COSTS, side=side)
        direct = sum(costs.direct(*shapes[n], group) for n in wide)
        pre = sum(costs.presketch(*shapes[n], 4096, group) for n in wide)
        got = check.refit_side(spec, shapes, args, {"default_direct": 1.0, "default_presketch": 1.0 + pre - direct})
        assert got["side"] == pytest.approx(side, rel=1e-6)
        takes = [n for n in wide if costs.presketch(*shapes[n], 4096, group) < min(
            costs.direct(*shapes[n], group), costs.fft(*shapes[n], 4096, group[0]))]
        assert got["layers_presketched"] == len(takes)
    assert got["layers_presketched"] < 3  # a dear sketch leaves some layers direct
    assert check.refit_side(spec, shapes, args, {"default_direct": 1.0}) is None
