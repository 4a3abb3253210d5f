"""The tensorsketch hook path's cuda engine (cropi.projection.tensorsketch), run here on CPU tensors (the
engine is chosen by a switch, not by the device), against brute-force per-example gradients; its helpers
(``BlockSketch``, ``RowGroups``, ``matmul_acc``) against their definitions; a bfloat16 model's factors kept
in bfloat16; and, on a CUDA machine (``-m gpu``), the CUDA device against the CPU.

The truth is the pair-hash count sketch of autograd's per-prompt gradients written out coordinate by
coordinate (test_batched_sketch.pair_hash_sketch), never anything the projector computes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support.gradients import LAYOUTS, PACKED_TOL, tiny_model, use_layout
from support.sketch import batched_vectors, double_model, pair_hash_sketch, shapes_of, two_prompts

import cropi.projection.tensorsketch as ts
from cropi.gradients.hooks import FactoredHooks
from cropi.projection import ProjectionSpec, TensorSketchProjector, make_projector
from cropi.projection.layers import RowGroups, group_sum
from cropi.projection.tensorsketch import BlockSketch, matmul_acc

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def force(monkeypatch, engine: str, route: str | None) -> None:
    monkeypatch.setattr(TensorSketchProjector, "engine", engine)
    monkeypatch.setattr(TensorSketchProjector, "route", route)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("route", ["direct", "presketch", "fft", None])
def test_cuda_engine_equals_the_pair_hash_sketch_of_brute_force_gradients(route, layout, monkeypatch, brute):
    """Every route of the cuda engine, and its own choice between them (None), in both layouts, with the
    prompts' rows summed inside the pass; float64 throughout, so only float rounding separates them. At dim 64
    the presketch route sketches the MLP's 96-wide sides and the tied 97-row output layer first."""
    use_layout(monkeypatch, layout)
    force(monkeypatch, "cuda", route)
    spec = ProjectionSpec(kind="tensorsketch", dim=64, seed=3)
    got = batched_vectors(double_model(), spec, two_prompts())
    assert got.dtype == torch.float64 and got.shape == (2, 64)
    for row, grads in enumerate(brute):
        want = pair_hash_sketch(spec, shapes_of(double_model()), grads, 64)
        np.testing.assert_allclose(got[row].numpy(), want,
                                   **(PACKED_TOL if layout == "packed" else dict(rtol=1e-9, atol=1e-12)))


@pytest.mark.parametrize("route", ["direct", "presketch", "fft"])
def test_cuda_engine_in_small_chunks_equals_it_in_one(route, monkeypatch):
    """The chunking that bounds the cuda engine's memory (output rows of a formed gradient; rows and tokens
    sketched at once) changes nothing but rounding: every chunk as small as one row or one token."""
    force(monkeypatch, "cuda", route)
    spec = ProjectionSpec(kind="tensorsketch", dim=96, seed=1)  # not a multiple of the sketch's block width
    whole = batched_vectors(double_model(), spec, two_prompts())
    monkeypatch.setattr(ts, "CUDA_PAIR_CHUNK", 1)
    monkeypatch.setattr(ts, "CUDA_FFT_CHUNK", 96)  # one token of one row a chunk
    chunked = batched_vectors(double_model(), spec, two_prompts())
    torch.testing.assert_close(chunked, whole, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("route", ["direct", "presketch"])
def test_cuda_direct_route_spread_over_copies_of_the_buckets_equals_one_copy(route, monkeypatch):
    """The cuda direct route adds a group's pairs into copies of the buckets (against atomic contention on a
    GPU) and sums them: a pair in the wrong copy's bucket, or copies summed wrongly, changes the vectors.
    The test model's layers are small enough for one copy; here they get as many as the cap allows."""
    force(monkeypatch, "cuda", route)
    spec = ProjectionSpec(kind="tensorsketch", dim=64 if route == "presketch" else 96, seed=2)
    one = batched_vectors(double_model(), spec, two_prompts())
    monkeypatch.setattr(ts, "ADDS_PER_COPY", 1)
    monkeypatch.setattr(ts, "SCATTER_SPREAD", ts.FOLDED * 96 * 7)  # 7 copies: no layer's input size a multiple of 7
    spread = batched_vectors(double_model(), spec, two_prompts())
    torch.testing.assert_close(spread, one, rtol=1e-10, atol=1e-12)


def test_the_cuda_engine_presketches_only_sides_wider_than_dim_and_by_cost():
    proj = make_projector(ProjectionSpec(kind="tensorsketch", dim=64), shapes_of(double_model()))
    assert proj.presketched_sides("model.layers.0.mlp.gate_proj.weight") == ("out",)  # 96 x 64
    assert proj.presketched_sides("model.layers.0.mlp.down_proj.weight") == ("in",)  # 64 x 96
    assert proj.presketched_sides("model.layers.0.self_attn.q_proj.weight") == ()
    groups = RowGroups.of([0, 0, 1])
    costs = ts.RouteCosts(flop=1e-15, pair=1e-11, spectrum=1e-8, side=0.0)  # sketching free: the narrower product
    old = ts.CUDA_COSTS
    try:
        ts.CUDA_COSTS = costs
        assert proj.cuda_route("model.layers.0.mlp.gate_proj.weight", groups, 8) == "presketch"
        assert proj.cuda_route("model.layers.0.self_attn.q_proj.weight", groups, 8) == "direct"
        ts.CUDA_COSTS = dataclasses.replace(costs, side=1.0)  # sketching dear: the pairs formed whole
        assert proj.cuda_route("model.layers.0.mlp.gate_proj.weight", groups, 8) == "direct"
    finally:
        ts.CUDA_COSTS = old


@pytest.mark.parametrize("engine", ["cpu", "cuda"])
def test_masking_the_input_or_the_output_gradient_gives_the_same_vectors(engine, monkeypatch):
    """The tensorsketch masks delta (its layers keep their shared inputs unmasked), except where a layer's
    output is much wider than its input (the output layer: masking x there copies a narrow tensor): both
    zero the padding's products, so the vectors agree whichever side each layer masks."""
    import cropi.gradients.hooks as hooks

    force(monkeypatch, engine, None)
    spec = ProjectionSpec(kind="tensorsketch", dim=64, seed=4)
    as_is = batched_vectors(double_model(), spec, two_prompts())
    monkeypatch.setattr(hooks, "WIDE_OUTPUT", 1)  # now every widening layer (gate, up, the output) masks x
    widened = batched_vectors(double_model(), spec, two_prompts())
    monkeypatch.setattr(TensorSketchProjector, "masks_delta", False)  # and now every layer
    inputs = batched_vectors(double_model(), spec, two_prompts())
    torch.testing.assert_close(widened, as_is, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(inputs, as_is, rtol=1e-12, atol=1e-14)


def test_cpu_engine_is_the_default_off_cuda_and_the_cuda_engine_on_it():
    proj = make_projector(ProjectionSpec(kind="tensorsketch", dim=64), shapes_of(tiny_model()))
    assert proj.engine_for(torch.device("cpu")) == "cpu"
    assert proj.engine_for(torch.device("cuda")) == "cuda"  # no CUDA needed to ask


@pytest.mark.parametrize("n,dim", [(7, 64), (300, 64), (1000, 4096), (50, 200)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_block_sketch_is_the_count_sketch(n, dim, dtype):
    """``C x``: bucket b holds the sum of sign(j) x_j over the coordinates j hashed to b, whatever the
    collisions (more coordinates than buckets, and fewer; a dim that is not a multiple of the block)."""
    gen = torch.Generator().manual_seed(n + dim)
    bucket = torch.randint(0, dim, (n,), generator=gen)
    sign = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
    x = torch.randn(3, 5, n, generator=gen, dtype=torch.float64)
    want = np.zeros((3, 5, dim))
    for j in range(n):  # the definition, coordinate by coordinate
        want[..., int(bucket[j])] += float(sign[j]) * x[..., j].numpy()
    got = BlockSketch(bucket, sign, dim, dtype=dtype)(x.to(dtype))
    assert got.shape == (3, 5, dim) and got.dtype == torch.promote_types(dtype, torch.float32)
    if dtype == torch.float64:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    else:  # inputs rounded to bfloat16 (2**-9), sums accumulated in float32
        exact = np.zeros((3, 5, dim))
        xr = x.to(dtype).double()
        for j in range(n):
            exact[..., int(bucket[j])] += float(sign[j]) * xr[..., j].numpy()
        np.testing.assert_allclose(got.numpy(), exact, rtol=1e-5, atol=1e-5)


def test_row_groups_from_host_values():
    g = RowGroups.of([0, 0, 1, 2, 1])
    assert g.n == 3 and g.counts == (2, 2, 1) and g.tokens(10) == [20, 20, 10]
    assert g.members[0] == slice(0, 2) and g.members[2] == slice(3, 4)
    assert torch.equal(g.members[1], torch.tensor([2, 4]))  # not contiguous: an index
    values = torch.arange(10.0).reshape(5, 2)
    torch.testing.assert_close(group_sum(values, g), torch.tensor([[2.0, 4.0], [12.0, 14.0], [6.0, 7.0]]))
    # a bare tensor (the former spelling) gives the same sums
    torch.testing.assert_close(group_sum(values, torch.tensor([0, 0, 1, 2, 1])), group_sum(values, g))


def test_matmul_acc_keeps_half_factors_and_returns_float32():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 40, generator=gen), torch.randn(40, 5, generator=gen)
    got = matmul_acc(a.bfloat16(), b.bfloat16())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, a.bfloat16().float() @ b.bfloat16().float())
    assert matmul_acc(a.double(), b.double()).dtype == torch.float64
    batched = matmul_acc(a.bfloat16()[None].expand(3, -1, -1), b.bfloat16()[None].expand(3, -1, -1))
    assert batched.shape == (3, 6, 5) and batched.dtype == torch.float32


@pytest.mark.parametrize("engine", ["cpu", "cuda"])
def test_a_bfloat16_model_keeps_bfloat16_factors_and_float32_sums(engine, monkeypatch):
    """The hooks hand the projector the model's own dtype (no float32 copy of every layer's input), the
    vectors come out float32, and they are the float32 model's up to bfloat16 rounding."""
    force(monkeypatch, engine, None)
    spec = ProjectionSpec(kind="tensorsketch", dim=256)
    seen = []
    original = TensorSketchProjector.layer_block

    def spy(self, name, delta, kept, groups=None):
        seen.append((delta.dtype, kept.dtype))
        return original(self, name, delta, kept, groups)

    monkeypatch.setattr(TensorSketchProjector, "layer_block", spy)
    model = tiny_model(1).to(torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    got = batched_vectors(model, spec, two_prompts())
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    ref = batched_vectors(tiny_model(1), spec, two_prompts())
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=1)
    assert float(cos.min()) > 0.97, cos


@pytest.mark.parametrize("engine", ["cpu", "cuda"])
def test_padding_is_masked_where_a_pass_has_any_and_a_pass_without_skips_the_multiply(engine, monkeypatch):
    """A pass whose host mask has no zero skips the masking multiply (``Capture.padded``), so the mask must still
    act wherever there is padding. A causal model gives padding no delta (nothing reads it), so here the loss
    reads every position's logits: positions marked padding then carry delta, and only the mask keeps their
    products out. The truth: autograd's weight gradients with every weight detached at the padded positions
    (the products at the other positions, delta from every position), pair-hash sketched row by row."""
    force(monkeypatch, engine, None)
    spec = ProjectionSpec(kind="tensorsketch", dim=64, seed=5)
    model = double_model()
    hooks = FactoredHooks(model, make_projector(spec, shapes_of(model)))
    ids = torch.randint(1, 90, (2, 7), generator=torch.Generator().manual_seed(0))

    def loss():
        return model(input_ids=ids).logits.logsumexp(-1).sum()

    def captured(mask):
        with hooks.capture(mask) as cap:
            cap.backward(loss())
        return cap

    whole = captured(torch.ones(2, 7))
    assert whole.padded is False and whole.masked(ids) is ids  # no multiply by ones
    mask = torch.ones(2, 7)
    mask[0, 4:] = 0  # row 0's last three positions and row 1's last one marked padding
    mask[1, 6:] = 0
    padded = captured(mask)
    assert padded.padded is True
    assert not torch.allclose(padded.rows, whole.rows)  # their delta was there, and the mask took it out

    def weights_only_at(keep):  # keep (2, 7): the positions whose products count
        def linear(mod, inputs, out):
            return torch.where(keep[..., None], out, torch.nn.functional.linear(
                inputs[0], mod.weight.detach(), None if mod.bias is None else mod.bias.detach()))

        def embedding(mod, inputs, out):
            return torch.where(keep[..., None], out, torch.nn.functional.embedding(inputs[0], mod.weight.detach()))
        return [m.register_forward_hook(linear) for m in model.modules() if isinstance(m, torch.nn.Linear)] + [
            model.get_input_embeddings().register_forward_hook(embedding)]

    params = dict(model.named_parameters())
    for row in range(2):
        keep = mask.bool().clone()
        keep[1 - row] = False
        handles = weights_only_at(keep)
        try:
            grads = dict(zip(params, torch.autograd.grad(loss(), list(params.values()), allow_unused=True)))
        finally:
            for h in handles:
                h.remove()
        want = pair_hash_sketch(spec, shapes_of(model), grads, 64)
        np.testing.assert_allclose(padded.rows[row].numpy(), want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("route", ["direct", "fft"])
def test_hooks_read_nothing_back_per_layer(route, monkeypatch):
    """The number of groups and their rows come from the host: no ``.item()``, ``int(tensor)``, ``tolist``
    or ``max`` of a device tensor once the pass has started (on CUDA each is a stream synchronisation)."""
    force(monkeypatch, "cuda", route)
    spec = ProjectionSpec(kind="tensorsketch", dim=64)
    model = tiny_model(2)
    proj = make_projector(spec, shapes_of(model))
    hooks = FactoredHooks(model, proj)
    calls = []
    for meth in ("item", "tolist", "__int__", "max"):
        original = getattr(torch.Tensor, meth)

        def spy(self, *a, _orig=original, _name=meth, **k):
            calls.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, meth, spy)
    ids = torch.randint(1, 90, (3, 7))
    with hooks.capture(torch.ones(3, 7), RowGroups.of([0, 1, 0])) as cap:
        logits = model(input_ids=ids).logits
        cap.backward(logits.float().logsumexp(-1).sum())
    # the block sketches' plans (built once per layer, then cached) may read back; the pass's work may not
    calls_first = list(calls)
    calls.clear()
    with hooks.capture(torch.ones(3, 7), RowGroups.of([0, 1, 0])) as cap:
        logits = model(input_ids=ids).logits
        cap.backward(logits.float().logsumexp(-1).sum())
    assert calls == [], (calls, calls_first)
    if route == "fft":  # the spies do see read-backs: the block sketches' plans, built in the first pass
        assert calls_first
    assert cap.rows.shape == (2, 64)


# -- on a CUDA machine --------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("route", ["direct", "presketch", "fft", None])
def test_cuda_and_cpu_engines_agree_on_a_float32_model(route, monkeypatch):
    """The CUDA device's engine (each route forced, and its own choice) against the CPU's reference engine."""
    monkeypatch.setattr(TensorSketchProjector, "route", route)
    spec = ProjectionSpec(kind="tensorsketch", dim=256)
    cpu = batched_vectors(tiny_model(1), spec, two_prompts())
    gpu = batched_vectors(tiny_model(1).cuda(), spec, two_prompts())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-5 * float(cpu.abs().max()))


@pytest.mark.gpu
@needs_cuda
def test_cuda_engine_on_a_bfloat16_model_matches_the_cpu_engine():
    """bfloat16 on both devices (the models' own arithmetic differs in rounding): vectors within bfloat16's
    precision of each other, and of the float32 model's."""
    spec = ProjectionSpec(kind="tensorsketch", dim=256)

    def bf16(device):
        m = tiny_model(1).to(device=device, dtype=torch.bfloat16)
        m.config._attn_implementation = "sdpa"
        return m

    cpu = batched_vectors(bf16("cpu"), spec, two_prompts())
    gpu = batched_vectors(bf16("cuda"), spec, two_prompts()).cpu()
    ref = batched_vectors(tiny_model(1), spec, two_prompts())
    assert gpu.dtype == torch.float32
    for other in (cpu, ref):
        assert float(torch.nn.functional.cosine_similarity(gpu, other, dim=1).min()) > 0.97
