"""Activation checkpointing on the batched hook path (``FactoredHooks.capture(checkpoint=True)``,
``ModelOptions.checkpoint_layers``): each decoder layer's forward runs again in the backward, the hooks keep a
layer's input from that second forward only, and a delta that comes first waits for it.

Checked against the definition (the pair-hash count sketch of brute-force gradients), not against the
unchecked path's own output: a hook that kept the first forward's input as well (the memory not saved), dropped
a delta that arrived before its recompute (the last layers of a decoder layer), or ran a layer's block twice
would each still give vectors of the right shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.gradients import LAYOUTS, PACKED_TOL, tiny_model, use_layout
from support.sketch import batched_vectors, double_model, pair_hash_sketch, shapes_of, two_prompts

import cropi.gradients.hooks as hooks
from cropi.errors import InvalidInputError
from cropi.gradients import LossOptions, make_computer
from cropi.gradients.batched import BatchedComputer
from cropi.gradients.options import ModelOptions
from cropi.projection import ProjectionSpec, TensorSketchProjector, make_projector

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def checkpoint_every_computer(monkeypatch) -> None:
    """Every BatchedComputer made from here on checkpoints its layers (ModelOptions.checkpoint_layers)."""
    init = BatchedComputer.__init__

    def patched(self, *a, **k):
        init(self, *a, **k)
        self.checkpoint_layers = True

    monkeypatch.setattr(BatchedComputer, "__init__", patched)


@pytest.fixture
def checkpointed(monkeypatch):
    """Every BatchedComputer checkpoints its layers; counts the deltas that waited for their recompute."""
    waited = []
    checkpoint_every_computer(monkeypatch)

    class Pending(dict):
        def __setitem__(self, key, value):
            waited.append(key)
            super().__setitem__(key, value)

    cap_init = hooks.Capture.__init__

    def cap_patched(self, *a, **k):
        cap_init(self, *a, **k)
        self.pending = Pending()

    monkeypatch.setattr(hooks.Capture, "__init__", cap_patched)
    return waited


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("engine,route", [("cpu", "direct"), ("cpu", "fft"), ("cuda", "direct"), ("cuda", "fft")])
def test_checkpointed_pass_equals_the_pair_hash_sketch_of_brute_force_gradients(engine, route, layout, monkeypatch,
                                                                                 brute, checkpointed):
    use_layout(monkeypatch, layout)
    monkeypatch.setattr(TensorSketchProjector, "engine", engine)
    monkeypatch.setattr(TensorSketchProjector, "route", route)
    monkeypatch.setattr(TensorSketchProjector, "direct_is_cheaper", lambda self, name, tokens: route == "direct")
    spec = ProjectionSpec(kind="tensorsketch", dim=64, seed=3)
    got = batched_vectors(double_model(), spec, two_prompts())
    assert checkpointed, "no delta came before its layer's recompute: the waiting path went untested"
    for row, grads in enumerate(brute):
        want = pair_hash_sketch(spec, shapes_of(double_model()), grads, 64)
        np.testing.assert_allclose(got[row].numpy(), want,
                                   **(PACKED_TOL if layout == "packed" else dict(rtol=1e-9, atol=1e-12)))


def test_checkpointed_factored_vectors_equal_the_unchecked_ones(monkeypatch):
    """The factored kind keeps ``P_in x`` (not ``x``) on the forward: the recompute's is the one it uses."""
    spec = ProjectionSpec(kind="factored", factor_in=8, factor_out=8, seed=2)
    plain = batched_vectors(double_model(), spec, two_prompts())
    checkpoint_every_computer(monkeypatch)
    again = batched_vectors(double_model(), spec, two_prompts())
    assert float(plain.abs().max()) > 0
    np.testing.assert_allclose(again.numpy(), plain.numpy(), rtol=1e-12, atol=1e-14)


def test_the_first_forward_keeps_no_decoder_input():
    """What saves the memory: after the pass's forward only layers outside the decoder (the tied output layer)
    hold an input; the decoder layers' inputs come with their recompute, one layer at a time."""
    model = double_model()
    comp = make_computer(model, make_projector(ProjectionSpec(kind="tensorsketch", dim=64), shapes_of(model)),
                         LossOptions())
    held = {}
    for checkpoint in (False, True):
        mask = torch.ones(1, 6)
        with comp.hooks.capture(mask, checkpoint=checkpoint) as cap:
            out = model(input_ids=torch.arange(1, 7)[None], use_cache=False).logits
            held[checkpoint] = sorted(cap.inputs)
            cap.backward(out[0, -1].logsumexp(-1))
        assert not cap.inputs and not cap.pending  # every kept input used once
        assert float(cap.rows.abs().max()) > 0
    decoder = [n for n in held[False] if ".layers." in n]
    assert len(decoder) == 2 * 7  # q, k, v, o, gate, up, down of 2 layers
    assert held[True] == sorted(set(held[False]) - set(decoder))
    assert not any(layer.__dict__.get("forward") for layer in comp.hooks.decoder_layers())  # forward restored


def test_a_model_without_a_decoder_layer_list_is_refused_with_the_option_named():
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = tiny_model().config
            self.embed = torch.nn.Embedding(8, 4)
            self.head = torch.nn.Linear(4, 8)

        def get_input_embeddings(self):
            return self.embed

    model = Flat()
    comp_hooks = hooks.FactoredHooks(model, make_projector(ProjectionSpec(kind="tensorsketch", dim=16),
                                                            shapes_of(model)))
    with pytest.raises(InvalidInputError, match="checkpoint_layers"):
        with comp_hooks.capture(torch.ones(1, 3), checkpoint=True):
            pass


def test_the_option_is_not_part_of_the_store_identity():
    """It changes what a pass holds, not its vectors: a job resumed with it continues the same store."""
    assert ModelOptions(checkpoint_layers=True).recorded("cuda") == ModelOptions().recorded("cuda")
    assert ModelOptions(checkpoint_layers=True).recorded("cpu") == {}


@pytest.mark.gpu
@needs_cuda
def test_checkpointed_cuda_vectors_equal_the_unchecked_ones(monkeypatch):
    spec = ProjectionSpec(kind="tensorsketch", dim=256)
    plain = batched_vectors(tiny_model(1).cuda(), spec, two_prompts())
    checkpoint_every_computer(monkeypatch)
    again = batched_vectors(tiny_model(1).cuda(), spec, two_prompts())
    torch.testing.assert_close(again, plain, rtol=1e-5, atol=1e-6 * float(plain.abs().max()))


def test_the_gradients_job_takes_the_flag_and_stores_the_same_vectors(tmp_path):
    """Through the CLI into a store: the same vectors as without the flag (float32 rounding apart), and the
    same store identity, so a job resumed with it continues the one it started."""
    from support.golden import VECTOR_RTOL, store_through_cli

    from cropi.projection.spec import DEFAULT_SPEC
    from cropi.store import GradientStore

    read = {}
    for label, flags in (("plain", ()), ("checkpointed", ("--checkpoint-layers",))):
        path = store_through_cli(tmp_path / label, "--dtype", "float32", *flags)
        split = GradientStore(str(path)).open_split("g", DEFAULT_SPEC.spec_id, "pool")
        read[label] = (split.read().vectors, split.extra)
    (plain, extra), (again, extra_again) = read["plain"], read["checkpointed"]
    assert extra == extra_again and np.abs(plain).max() > 0
    np.testing.assert_allclose(again, plain, rtol=0, atol=VECTOR_RTOL * float(np.abs(plain).max()))


def test_a_per_prompt_kind_with_the_flag_is_refused_before_anything_is_written(tmp_path):
    from cropi.pipeline.compute_gradients import GradientJob, compute_gradients

    job = GradientJob(model=str(tmp_path / "never-loaded"), trajectories=str(tmp_path / "t"), store=str(tmp_path / "s"),
                      split="pool", projection={"kind": "sjlt", "dim": 64},
                      model_options={"checkpoint_layers": True})
    with pytest.raises(InvalidInputError, match="checkpoint_layers applies to the batched kinds"):
        compute_gradients(job)
    assert not (tmp_path / "s").exists()


def test_a_layer_forward_set_on_the_instance_by_someone_else_is_put_back():
    model = double_model()
    comp = make_computer(model, make_projector(ProjectionSpec(kind="tensorsketch", dim=64), shapes_of(model)),
                         LossOptions())
    layer = comp.hooks.decoder_layers()[0]
    theirs = layer.forward  # the class's, bound: set on the instance as a wrapping library would
    layer.forward = theirs
    with comp.hooks.capture(torch.ones(1, 4), checkpoint=True) as cap:
        assert layer.__dict__["forward"] is not theirs
        out = model(input_ids=torch.arange(1, 5)[None], use_cache=False).logits
        cap.backward(out[0, -1].logsumexp(-1))
    assert layer.__dict__["forward"] is theirs
    assert "forward" not in comp.hooks.decoder_layers()[1].__dict__
