"""The batched kinds (factored, tensorsketch) against their definitions, with the truth from brute force.

- Per block, ``<P(g1), P(g2)>`` is an unbiased estimate of ``<g1, g2>`` over projection seeds: the
  truth is the inner product of autograd's per-prompt gradients (tests/support/gradients.py), never
  anything the projectors compute; the estimates come from the batched hook path.
- No two blocks share a random matrix (factored) or a hash (tensorsketch).
- The tensorsketch hook path equals the count sketch of brute-force gradients under the pair hash
  written out coordinate by coordinate here.
- Why the factored kind was replaced for scoring: on a rank-one gradient its error does not shrink
  with the block size, the TensorSketch's does.

Tolerance of the unbiasedness tests: over S seeds the mean estimate has standard error
sd / sqrt(S), with sd the estimates' own sample standard deviation. A bias-free estimator lies
within 5 standard errors of the truth with probability 1 - 6e-7 (normal approximation; the
mean of 300 independent estimates is close to normal), so over the ~16 blocks of a test a false
alarm has probability < 1e-5; the seeds are fixed, so the test is deterministic. A wrong sign or a
wrong scale of a block (a factor 1 - 2 / (5 sd / sqrt(S) / |truth|)) fails it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from support.gradients import LAYOUTS, PACKED_TOL, brute_force_grad, tiny_model, use_layout
from support.sketch import batched_vectors, double_model, pair_hash_sketch, shapes_of, two_prompts

from cropi.projection import ProjectionSpec, TensorSketchProjector, make_projector
from cropi.projection.dense import dense_block
from cropi.utils.hashing import name_key

SEEDS = 200
Z = 5.0


@pytest.fixture(scope="module")
def truth():
    """Per parameter, <g1, g2> from autograd's per-prompt gradients (float64), and the gradients."""
    model, trajs = double_model(), two_prompts()
    g1, g2 = (dict(brute_force_grad(model, t)) for t in trajs)
    return {n: float((g1[n] * g2[n]).sum()) for n in g1}, (g1, g2)


def check_unbiased(estimates: np.ndarray, truth: float, what: str) -> None:
    mean, se = estimates.mean(), estimates.std(ddof=1) / math.sqrt(len(estimates))
    assert abs(mean - truth) <= Z * se + 1e-12 * abs(truth), (
        f"{what}: mean estimate {mean:.6g} vs truth {truth:.6g} ({(mean - truth) / se:.1f} standard errors)")


@pytest.mark.parametrize("kind", ["factored", "tensorsketch"])
def test_per_block_inner_products_are_unbiased_over_seeds(kind, truth):
    """Every covered layer's share of <P(g1), P(g2)> (a factored block; for tensorsketch, the layer alone)
    averages to that layer's exact <g1, g2> over 200 seeds. Projected from the brute-force gradients: the
    hook path equals that exactly (tests/test_factored.py; for tensorsketch, the test below)."""
    dots, (g1, g2) = truth
    model, trajs = double_model(), two_prompts()
    names = make_projector(ProjectionSpec(kind="factored", factor_in=2, factor_out=2), shapes_of(model)).param_names
    assert "model.embed_tokens.weight" in names  # the tied embedding / output block is among them
    est = {n: [] for n in names}
    for seed in range(SEEDS):
        if kind == "factored":
            spec = ProjectionSpec(kind="factored", factor_in=3, factor_out=4, seed=seed)
            proj = make_projector(spec, shapes_of(model))
            v = proj.project((n, torch.stack([g1[n], g2[n]])) for n in names).double()
            for n in names:
                a = proj.offset(n)
                blk = v[:, a:a + proj.block_size]
                est[n].append(float(blk[0] @ blk[1]))
        else:
            for n in names:
                spec = ProjectionSpec(kind="tensorsketch", dim=16, seed=seed, include="^" + n.replace(".", r"\.") + "$")
                v = make_projector(spec, shapes_of(model)).project([(n, torch.stack([g1[n], g2[n]]))]).double()
                est[n].append(float(v[0] @ v[1]))
    for n in names:
        check_unbiased(np.array(est[n]), dots[n], f"{kind} block {n}")


def test_tensorsketch_whole_vector_is_unbiased_over_seeds(truth):
    """All layers share one tensorsketch vector: the cross-layer collisions must cancel too."""
    dots, (g1, g2) = truth
    shapes = shapes_of(double_model())
    names = make_projector(ProjectionSpec(kind="tensorsketch", dim=32), shapes).param_names
    want = sum(dots[n] for n in names)
    est = []
    for s in range(SEEDS):
        v = make_projector(ProjectionSpec(kind="tensorsketch", dim=32, seed=s), shapes).project(
            (n, torch.stack([g1[n], g2[n]])) for n in names).double()
        est.append(float(v[0] @ v[1]))
    check_unbiased(np.array(est), want, "tensorsketch whole vector")


def test_no_two_blocks_share_a_random_matrix_or_hash():
    """Every block's P_out and P_in (factored), and every layer's side hashes (tensorsketch), are drawn
    afresh: no entry sequence repeats across blocks, sides or seeds, and entries of different blocks are
    uncorrelated (|r| < 5 / sqrt(n), n the entries compared)."""
    shapes = shapes_of(tiny_model())
    spec = ProjectionSpec(kind="factored", factor_in=8, factor_out=8)
    fac = make_projector(spec, shapes)
    mats = {}
    for seed in (0, 1):
        p = make_projector(spec.model_copy(update={"seed": seed}), shapes)
        for n in p.param_names:
            pout, pin = p.matrices(n)
            mats[(seed, n, "out")], mats[(seed, n, "in")] = pout.reshape(-1), pin.reshape(-1)
    keys = list(mats)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            x, y = mats[a], mats[b]
            m = min(len(x), len(y))
            r = float(torch.corrcoef(torch.stack([x[:m], y[:m]]))[0, 1])
            assert abs(r) < Z / math.sqrt(m), f"{a} and {b} share entries (correlation {r:.3f})"
            assert not torch.equal(x[:8], y[:8])
    assert len({name_key(n, 0) for n in fac.param_names}) == len(fac.param_names)

    ts = make_projector(ProjectionSpec(kind="tensorsketch", dim=1 << 20), shapes)
    sides = {}
    for n in ts.param_names:
        h_out, s_out, h_in, s_in = ts.hashes(n)
        sides[(n, "out")], sides[(n, "in")] = (h_out, s_out), (h_in, s_in)
    buckets = list(sides.items())
    for i, (a, (ha, sa)) in enumerate(buckets):
        for b, (hb, sb) in buckets[i + 1:]:
            m = min(len(ha), len(hb))
            # with 2**20 buckets two independent hashes agree at a coordinate with probability 1e-6
            assert int((ha[:m] == hb[:m]).sum()) <= 1, f"{a} and {b} share bucket hashes"
            r = float(torch.corrcoef(torch.stack([sa[:m], sb[:m]]))[0, 1])
            assert abs(r) < Z / math.sqrt(m), f"{a} and {b} share signs (correlation {r:.3f})"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("route", ["direct", "fft"])
def test_tensorsketch_hook_path_equals_the_pair_hash_sketch_of_brute_force_gradients(route, layout, monkeypatch):
    """Both exact routes of the hook path (the row's gradient formed and scattered, or the FFT of the two
    sides' count sketches), with the prompts' rows summed per prompt inside the pass, in both layouts."""
    use_layout(monkeypatch, layout)
    monkeypatch.setattr(TensorSketchProjector, "direct_is_cheaper", lambda self, name, tokens: route == "direct")
    trajs = two_prompts()
    model = double_model()
    spec = ProjectionSpec(kind="tensorsketch", dim=64, seed=3)
    got = batched_vectors(model, spec, trajs)
    proj = make_projector(spec, shapes_of(model))
    assert isinstance(proj, TensorSketchProjector) and got.shape == (2, 64) and got.dtype == torch.float64
    for row, t in enumerate(trajs):
        grads = dict(brute_force_grad(double_model(), t))
        want = pair_hash_sketch(spec, shapes_of(model), grads, 64)
        np.testing.assert_allclose(got[row].numpy(), want,
                                   **(PACKED_TOL if layout == "packed" else dict(rtol=1e-9, atol=1e-12)))
        formed = proj.project((n, grads[n][None]) for n in proj.param_names)[0]  # the formed-gradient path
        np.testing.assert_allclose(formed.numpy(), want, rtol=1e-5, atol=1e-7)


def test_tensorsketch_spec_fields():
    spec = ProjectionSpec(kind="tensorsketch", dim=4096)
    assert spec.kept_fraction == 1.0 and spec.factor_in is None
    assert ProjectionSpec.from_record(spec.model_dump() | {"spec_id": spec.spec_id}) == spec
    with pytest.raises(ValueError, match="kept_fraction is ignored"):
        ProjectionSpec(kind="tensorsketch", dim=64, kept_fraction=0.1)
    # stored ids of the other kinds unchanged (the former default sjlt spec's)
    assert ProjectionSpec(kind="sjlt", dim=32768, kept_fraction=0.1).spec_id == "d46e98ad85e66abb"


def test_on_a_rank_one_gradient_factored_error_stalls_and_tensorsketch_error_shrinks():
    """The defect behind fidelity_factored.json: G1 = a b^T, G2 = c d^T (the fidelity model's gradients
    are this close to rank one). The factored estimate is a product of two JL estimates of dimension
    factor, so squaring its output size (8x8 -> 32x32: 16x more outputs) only halves its error; the
    TensorSketch's error falls as 1/sqrt(dim). Errors are relative to |G1| |G2|, over 40 seeds."""
    gen = torch.Generator().manual_seed(0)
    a, c = torch.randn(512, generator=gen, dtype=torch.float64), torch.randn(512, generator=gen, dtype=torch.float64)
    b, d = torch.randn(384, generator=gen, dtype=torch.float64), torch.randn(384, generator=gen, dtype=torch.float64)
    c, d = c + a, d + b  # correlated, as a pool gradient and the validation mean are
    g = torch.stack([torch.outer(a, b), torch.outer(c, d)])
    truth, scale = float((g[0] * g[1]).sum()), float(g[0].norm() * g[1].norm())

    def rms_error(spec_of):
        errs = []
        for s in range(40):
            p = make_projector(spec_of(s), {"w.weight": (512, 384)})
            y = p.project([("w.weight", g)]).double()
            errs.append((float(y[0] @ y[1]) - truth) / scale)
        return float(np.sqrt(np.mean(np.square(errs))))

    fac = {f: rms_error(lambda s, f=f: ProjectionSpec(kind="factored", factor_in=f, factor_out=f, seed=s))
           for f in (8, 32)}
    ts = {k: rms_error(lambda s, k=k: ProjectionSpec(kind="tensorsketch", dim=k, seed=s)) for k in (64, 1024)}
    assert fac[8] / fac[32] < 3          # 16x the outputs: about 2x less error (4x for a JL map)
    assert ts[64] / ts[1024] > 2.5       # 16x the outputs: about 4x less error
    assert ts[1024] < fac[32] / 2        # at the same 1024 outputs the TensorSketch is several times closer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_tensorsketch_vectors_agree():
    trajs = two_prompts()
    spec = ProjectionSpec(kind="tensorsketch", dim=256)
    cpu = batched_vectors(tiny_model(1), spec, trajs)
    gpu = batched_vectors(tiny_model(1).cuda(), spec, trajs)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-6)
