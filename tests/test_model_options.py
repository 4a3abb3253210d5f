"""How the scored model runs (cropi.gradients.options.ModelOptions: its dtype and attention, 'auto' per
device), the default spec per device (cropi.projection.spec.default_spec), and a micro-batch the device
has no memory for (cropi.gradients.batched: run again in halves, a single row refused naming the options).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.gradients import tiny_model
from support.sketch import batched_vectors, double_model, two_prompts

import cropi.projection.spec as spec_mod
from cropi.errors import InvalidInputError
from cropi.gradients import LossOptions, make_computer
from cropi.gradients.batched import BatchedComputer
from cropi.gradients.options import ModelOptions
from cropi.pipeline.compute_gradients import GradientJob
from cropi.projection import ProjectionSpec, make_projector
from cropi.projection.spec import DEFAULT_SPEC, default_spec

JOB = dict(model="m", trajectories="t", store="s", split="pool")


def test_auto_is_float32_eager_on_cpu_and_bfloat16_sdpa_on_cuda():
    auto = ModelOptions()
    assert auto.resolve("cpu") == ("float32", "eager")
    assert auto.resolve("cuda") == auto.resolve("cuda:1") == ("bfloat16", "sdpa")
    assert ModelOptions(model_dtype="float32", attention="eager").resolve("cuda") == ("float32", "eager")
    assert ModelOptions(model_dtype="bfloat16").resolve("cpu") == ("bfloat16", "eager")
    # recorded in the store's identity only when not float32 + eager: stores made before still match
    assert auto.recorded("cpu") == {} and ModelOptions(model_dtype="float32").recorded("cuda:0") == {
        "model_dtype": "float32", "attention": "sdpa"}
    assert auto.recorded("cuda") == {"model_dtype": "bfloat16", "attention": "sdpa"}
    with pytest.raises(ValueError):
        ModelOptions(model_dtype="int8")


def test_the_gradients_job_takes_them_as_flags():
    from cropi.cli import build_parser, gradient_job_from_args

    args = ["gradients", "--model", "m", "--trajectories", "t", "--store", "s", "--split", "pool"]
    parser = build_parser()
    assert gradient_job_from_args(parser.parse_args(args)).model_options == ModelOptions()
    job = gradient_job_from_args(parser.parse_args(args + ["--model-dtype", "bfloat16", "--attention", "sdpa"]))
    assert job.model_options == ModelOptions(model_dtype="bfloat16", attention="sdpa")
    assert GradientJob.model_validate(JOB | {"model_options": {"model_dtype": "float32"}}).model_options.model_dtype \
        == "float32"


def test_the_default_spec_is_chosen_per_device_in_one_table(monkeypatch):
    assert default_spec("cpu") == default_spec() == DEFAULT_SPEC
    assert default_spec("cuda") == default_spec("cuda:3") == spec_mod.DEVICE_DEFAULTS["cuda"]
    assert default_spec("mps") == DEFAULT_SPEC  # a device without its own entry: CPU's
    job = GradientJob(**JOB)
    assert job.on_device("cpu").projection == DEFAULT_SPEC
    other = ProjectionSpec(dim=8192)
    monkeypatch.setitem(spec_mod.DEVICE_DEFAULTS, "cuda", other)  # what a measurement would change
    assert job.on_device("cuda").projection == other and job.on_device("cpu").projection == DEFAULT_SPEC
    named = GradientJob(**JOB, projection={"dim": 1024})  # a projection named is kept on every device
    assert named.on_device("cuda").projection == ProjectionSpec(dim=1024)


def test_a_bfloat16_job_records_its_dtype_and_its_ranking_says_where_fidelity_was_measured(tmp_path, capsys):
    from support.golden import rank_through_cli, store_through_cli

    from cropi.projection.fidelity import BENCHMARK, measured, notice_for_split
    from cropi.store import GradientStore

    path = store_through_cli(tmp_path, "--dtype", "float32", "--model-dtype", "bfloat16", "--device", "cpu")
    pool = GradientStore(str(path)).open_split("g", DEFAULT_SPEC.spec_id, "pool")
    assert pool.extra["model"] == {"model_dtype": "bfloat16", "attention": "eager"}
    vectors = pool.read().vectors
    assert np.isfinite(vectors).all() and np.abs(vectors).sum() > 0
    capsys.readouterr()
    ranked = rank_through_cli(path)
    assert ranked["meta"]["fidelity"] == measured(DEFAULT_SPEC, "bfloat16")
    text = notice_for_split(str(path), "g", DEFAULT_SPEC.spec_id, "pool")
    if measured(DEFAULT_SPEC, "bfloat16") is None:  # not measured: the notice names the benchmark and the dtype
        assert text and BENCHMARK in text and "bfloat16" in text
    else:
        assert text is None
    # float32 (the default on CPU): nothing recorded, the float32 measurement cited, with its device
    assert measured(DEFAULT_SPEC)["device"] == "cpu" and measured(DEFAULT_SPEC)["model_dtype"] == "float32"


def _oom_once_when_more_than(limit: int, monkeypatch) -> list[int]:
    """Make every micro-batch of more than ``limit`` items fail as a CUDA out-of-memory error would."""
    sizes = []
    for method in ("_micro_batch", "_packed_batch"):
        original = getattr(BatchedComputer, method)

        def run(self, prompts, items, out, _orig=original):
            sizes.append(len(items))
            if len(items) > limit:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return _orig(self, prompts, items, out)

        monkeypatch.setattr(BatchedComputer, method, run)
    return sizes


@pytest.mark.parametrize("pack", [True, False])
def test_a_micro_batch_without_memory_is_run_in_halves_with_the_same_vectors(pack, monkeypatch):
    spec = ProjectionSpec(kind="tensorsketch", dim=64, seed=2)
    model = double_model()

    def vectors():
        comp = make_computer(model, make_projector(spec, {n: tuple(p.shape) for n, p in model.named_parameters()}),
                             LossOptions())
        comp.pack = pack
        return comp.vectors([comp._prepare(t) for t in two_prompts()])

    whole = vectors()
    sizes = _oom_once_when_more_than(1, monkeypatch)
    halves = vectors()
    assert max(sizes) > 1 and 1 in sizes  # it failed, then ran smaller
    torch.testing.assert_close(halves, whole, rtol=1e-9, atol=1e-12)


def test_a_single_row_without_memory_is_refused_naming_the_options(monkeypatch):
    _oom_once_when_more_than(0, monkeypatch)
    with pytest.raises(InvalidInputError, match="--max-length"):
        batched_vectors(tiny_model(), ProjectionSpec(kind="tensorsketch", dim=64), two_prompts())
