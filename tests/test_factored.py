"""The factored projection: the kind against a Kronecker product, and the batched hook path against
brute-force per-prompt gradients (float64, one unpadded sequence at a time) through the same P_out / P_in."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from support.gradients import LAYOUTS, PACKED_TOL, brute_force_grad, copy_response, make_traj, tiny_model, use_layout

from cropi.errors import InvalidInputError
from cropi.gradients import LossOptions, make_computer
from cropi.gradients.batched import BatchedComputer
from cropi.projection import FactoredProjector, ProjectionSpec, make_projector
from cropi.projection.dense import dense_block
from cropi.utils.hashing import name_key

SPEC = ProjectionSpec(kind="factored", factor_in=3, factor_out=4, seed=5)


def shapes_of(model):
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def kron_reference(spec, name, grad):
    """vec(P_out G P_in^T) = (P_out kron P_in) vec(G), the matrices from the hash directly."""
    key = name_key(name, spec.seed)
    out_f, in_f = grad.shape[-2:]
    p_out = dense_block("gaussian", key, torch.arange(out_f), spec.factor_out, stream=2).double().T
    p_in = dense_block("gaussian", key, torch.arange(in_f), spec.factor_in, stream=1).double().T
    return torch.kron(p_out, p_in) @ grad.double().reshape(-1)


# ---------------------------------------------------------------- the spec and the projector


def test_factored_spec_defaults_validation_and_ids_of_other_kinds_unchanged():
    spec = ProjectionSpec(kind="factored")
    assert spec.dim is None and spec.kept_fraction == 1.0 and spec.factor_in == spec.factor_out == 16
    assert ProjectionSpec.from_record(spec.model_dump() | {"spec_id": spec.spec_id}) == spec
    ids = {spec.spec_id, ProjectionSpec(kind="factored", factor_in=8).spec_id,
           ProjectionSpec(kind="factored", exclude="bias").spec_id, ProjectionSpec(kind="factored", seed=1).spec_id}
    assert len(ids) == 4
    # the id of the former default sjlt spec is the one stored before the factored fields existed
    assert ProjectionSpec(kind="sjlt", dim=32768, kept_fraction=0.1).spec_id == "d46e98ad85e66abb"
    for bad, words in ((dict(kind="factored", dim=64), "leave dim unset"),
                       (dict(kind="factored", kept_fraction=0.1), "kept_fraction is ignored"),
                       (dict(kind="factored", factor_in=0), "[1, 4096]"),
                       (dict(kind="sjlt", factor_in=8), "belong to kind='factored'")):
        with pytest.raises(ValidationError, match=None) as info:
            ProjectionSpec(**bad)
        assert words in str(info.value)


def test_projector_blocks_equal_the_kronecker_product_and_skip_biases_and_norms():
    model = tiny_model()
    proj = make_projector(SPEC, shapes_of(model))
    assert isinstance(proj, FactoredProjector)
    names = proj.param_names
    assert names[0] == "model.embed_tokens.weight"  # tied: the embedding and the output layer, one block
    assert all(n.endswith("_proj.weight") for n in names[1:]) and len(names) == 1 + 2 * 7  # no bias or norm
    assert proj.out_dim == len(names) * 12 and proj.n_kept == proj.n_coords
    gen = torch.Generator().manual_seed(0)
    grads = {n: torch.randn(2, *s, generator=gen, dtype=torch.float64) for n, s in shapes_of(model).items()}
    got = proj.project((n, g) for n, g in grads.items())
    for row in range(2):
        want = torch.cat([kron_reference(SPEC, n, grads[n][row]) for n in names])
        np.testing.assert_allclose(got[row].numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_squared_norm_is_unbiased_over_seeds():
    g = torch.randn(1, 24, 20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    norms = [float(make_projector(ProjectionSpec(kind="factored", factor_in=4, factor_out=4, seed=s),
                                  {"a.weight": (24, 20)}).project([("a.weight", g)]).double().pow(2).sum())
             for s in range(400)]
    truth = float(g.pow(2).sum())
    assert abs(np.mean(norms) / truth - 1) < 4 * np.std(norms) / truth / math.sqrt(len(norms))


# ---------------------------------------------------------------- the batched hook path, exact


def double_model(seed=0):
    model = tiny_model(seed).double()
    # eager attention in float64 turns left padding's fully masked rows into NaN (finfo.min + score
    # overflows to -inf), which then reaches real tokens; sdpa does not (float32 eager does not either)
    model.config._attn_implementation = "sdpa"
    return model


def brute_factored(model, traj, spec, clip=None):
    """P_out G P_in^T of every projected layer, G from brute_force_grad (autograd per response, unpadded)."""
    grads = dict(brute_force_grad(model, traj, clip))
    names = make_projector(spec, shapes_of(model)).param_names
    return torch.cat([kron_reference(spec, n, grads[n]) for n in names])


def prompts(seed=0):
    """Prompts of unequal lengths, K > 1 responses of unequal lengths, behavior log-probs off-policy; two
    responses drawn twice (packed once): one copy with the same reward, one with another."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (rewards, plen) in enumerate((([1, 0, 1, 0, 0], 3), ([0, 1, 1], 7), ([1, 0], 5), ([0, 0, 1, 1, 0, 1], 4))):
        t = make_traj(rng, rewards, prompt_len=plen)
        t.prompt_id = f"p{i}"
        if i in (0, 3):
            copy_response(t, *((0, 2) if i == 0 else (2, 4)))
        # behavior log-probs are stored as float32 (as collected): keep the brute force on the same values
        t.behavior_logprobs = [np.float32(b).astype(float).tolist() for b in t.behavior_logprobs]
        out.append(t)
    return out


def factored_vectors(model, spec, trajs, **opts):
    comp = make_computer(model, make_projector(spec, shapes_of(model)), LossOptions(**opts))
    assert isinstance(comp, BatchedComputer)
    prepared = [comp._prepare(t) for t in trajs]
    return comp.vectors(prepared), comp


# budget 12: every row alone or in pairs, prompts split across micro-batches; 10_000: all rows in one
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("clip,budget", [(None, 12), (0.2, 10_000), (None, 10_000)])
def test_batched_vectors_equal_projected_brute_force_gradients(clip, budget, layout, monkeypatch):
    """Prompts with K = 5, 3, 2, 6 responses of lengths 1-8 and prompts of 3-7 tokens in one call: POPI's
    1/K and 1/|y_k| (brute_force_grad: term.mean() per response, / len(responses)) and the padding pinned.
    Every layer, the tied embedding / output matrix included (its block: lookup plus output-layer terms)."""
    use_layout(monkeypatch, layout)
    trajs = prompts()
    want = torch.stack([brute_factored(double_model(), t, SPEC, clip) for t in trajs])
    got, _ = factored_vectors(double_model(), SPEC, trajs, clip_eps=clip, token_budget=budget)
    assert got.dtype == torch.float64 and got.shape == want.shape
    torch.testing.assert_close(got, want, **(PACKED_TOL if layout == "packed" else dict(rtol=1e-9, atol=1e-12)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_real_token_equal_to_the_padding_id_gets_no_input_embedding_gradient(layout, monkeypatch):
    """nn.Embedding never updates its padding row: a prompt or response token equal to ``padding_idx``
    (0 here, the pad id) inside a sequence adds nothing through the lookup (its output-layer share stays)."""
    use_layout(monkeypatch, layout)
    trajs = prompts(5)
    assert double_model().get_input_embeddings().padding_idx == 0
    trajs[0].prompt_token_ids[1] = 0
    trajs[1].responses[0] = [0] + trajs[1].responses[0]
    trajs[1].behavior_logprobs[0] = [-3.0] + trajs[1].behavior_logprobs[0]
    want = torch.stack([brute_factored(double_model(), t, SPEC) for t in trajs])
    got, _ = factored_vectors(double_model(), SPEC, trajs)
    torch.testing.assert_close(got, want, **(PACKED_TOL if layout == "packed" else dict(rtol=1e-9, atol=1e-12)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_prompt_gets_the_same_vector_in_a_batch_as_alone(layout, monkeypatch):
    use_layout(monkeypatch, layout)
    trajs = prompts(3)
    model = double_model(2)
    together, comp = factored_vectors(model, SPEC, trajs)
    alone = torch.cat([comp.vectors([comp._prepare(t)]) for t in trajs])
    torch.testing.assert_close(together, alone, rtol=1e-10, atol=1e-13)
    # and through the float32 records, in another order
    records = comp.compute_many(trajs[::-1])[::-1]
    for rec, t, v in zip(records, trajs, alone):
        assert rec.prompt_id == t.prompt_id and rec.status == "ok"
        np.testing.assert_allclose(rec.vector, v.float().numpy(), rtol=1e-5, atol=1e-7)
        assert rec.raw_norm == pytest.approx(float(v.norm()))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_statuses_and_ess_match_the_per_prompt_path(layout, monkeypatch):
    use_layout(monkeypatch, layout)
    rng = np.random.default_rng(7)
    live, flat = make_traj(rng, [1, 0, 1]), make_traj(rng, [1, 1, 1])
    flat.prompt_id = "flat"
    long = make_traj(rng, [1, 0], prompt_len=15)
    long.prompt_id = "long"
    fact = make_computer(tiny_model(), make_projector(SPEC, shapes_of(tiny_model())), LossOptions(max_length=14))
    plain = make_computer(tiny_model(), make_projector(ProjectionSpec(kind="sjlt", dim=16), shapes_of(tiny_model())),
                          LossOptions(max_length=14))
    got = fact.compute_many([live, flat, long])
    want = [plain.compute(t) for t in (live, flat, long)]
    assert [r.status for r in got] == [r.status for r in want] == ["ok", "zero_advantage", "truncated"]
    assert not np.any(got[1].vector) and not np.any(got[2].vector) and np.any(got[0].vector)
    for a, b in zip(got, want):
        assert (a.ess is None) == (b.ess is None)
        if a.ess is not None:
            assert a.ess == pytest.approx(b.ess, rel=1e-5)
        assert (a.n_responses, a.n_tokens, a.reward_mean) == (b.n_responses, b.n_tokens, b.reward_mean)
    assert all(p.grad is None for p in fact.model.parameters())


def test_hooks_refuse_a_weight_of_another_kind_of_module():
    model = tiny_model()
    model.extra = torch.nn.Embedding(3, 4)  # a 2-d weight that is neither a linear layer nor the input embedding
    with pytest.raises(InvalidInputError, match="a weight of Embedding"):
        make_computer(model, make_projector(SPEC, shapes_of(model)))
    spec = SPEC.model_copy(update={"exclude": "extra"})
    assert isinstance(make_computer(model, make_projector(spec, shapes_of(model))), BatchedComputer)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_batched_vectors_agree():
    trajs = prompts(5)
    cpu, _ = factored_vectors(tiny_model(1), SPEC, trajs)
    gpu, _ = factored_vectors(tiny_model(1).cuda(), SPEC, trajs)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-6)


def test_the_gradients_job_stores_factored_vectors_that_rank(tmp_path):
    """The CLI's gradients job on the golden case with kind factored: many prompts per call, vectors equal
    to each prompt computed alone, and the store, rank step and spec id take them unchanged."""
    from support.golden import COLLECT, GOLDEN, MODEL, cli as _cli

    from cropi.models.loading import load_causal_lm
    from cropi.store import GradientStore, TrajectoryStore

    for split in ("pool", "val_a"):
        _cli("collect", "--model", str(MODEL), "--prompts", str(GOLDEN / f"{split}.jsonl"),
             "--out", str(tmp_path / split), *COLLECT)
        _cli("gradients", "--model", str(MODEL), "--trajectories", str(tmp_path / split), "--store",
             str(tmp_path / "store"), "--split", split, "--name", "g", "--projection-kind", "factored",
             "--factor-in", "4", "--factor-out", "2", "--dtype", "float32")
    ranked = _cli("rank", "--store", str(tmp_path / "store"), "--name", "g", "--pool", "pool",
                  "--validation", "val_a", "--top-fraction", "0.25")
    spec = ProjectionSpec(kind="factored", factor_in=4, factor_out=2)
    assert ranked["meta"]["spec_id"] == spec.spec_id and ranked["rows"]
    stored = GradientStore(str(tmp_path / "store")).open_split("g", spec.spec_id, "pool").read()
    model = load_causal_lm(MODEL)
    alone = make_computer(model, make_projector(spec, shapes_of(model)))
    trajs = {t.prompt_id: t for t in TrajectoryStore.open(str(tmp_path / "pool")).iter_prompts(stored.prompt_ids)}
    assert stored.vectors.shape[1] == alone.projector.out_dim
    assert "ok" in stored.columns["status"]
    for i, pid in enumerate(stored.prompt_ids):
        rec = alone.compute(trajs[pid])
        assert rec.status == stored.columns["status"][i]
        np.testing.assert_allclose(stored.vectors[i], rec.vector, rtol=1e-4, atol=1e-6 * np.abs(rec.vector).max())
