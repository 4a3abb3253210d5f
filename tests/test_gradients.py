"""POPI gradients against an independently written brute-force loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from cropi.gradients import GradientComputer, LossOptions, group_advantages
from cropi.projection import ProjectionSpec, make_projector
from support.gradients import (VOCAB, Traj, brute_force_grad, computer_for, make_traj, seq_logprobs,  # noqa: F401
                               tiny_model)


@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("budget", [8, 10_000])
def test_popi_gradient_matches_brute_force(clip, budget):
    model = tiny_model()
    traj = make_traj(np.random.default_rng(1), [1, 0, 1, 0, 0, 1])
    spec = ProjectionSpec(kind="identity", kept_fraction=1.0)
    comp, proj = computer_for(model, spec, clip_eps=clip, token_budget=budget)
    got = comp.compute(traj)
    want = brute_force_grad(model, traj, clip)
    want_vec = proj.project([(n, g[None].float()) for n, g in want])[0].numpy()
    assert got.status == "ok"
    np.testing.assert_allclose(got.vector, want_vec, rtol=2e-4, atol=1e-7)
    want_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for _, g in want))
    assert got.raw_norm == pytest.approx(want_norm, rel=1e-4)
    assert got.n_responses == 6 and got.reward_mean == pytest.approx(0.5)


def test_projected_gradient_is_projection_of_brute_force():
    model = tiny_model(3)
    traj = make_traj(np.random.default_rng(2), [1, 0, 0, 0])
    spec = ProjectionSpec(kind="sjlt", dim=256, kept_fraction=0.5, seed=7)
    comp, proj = computer_for(model, spec, token_budget=16)
    got = comp.compute(traj).vector
    want = proj.project([(n, g[None].float()) for n, g in brute_force_grad(model, traj)])[0].numpy()
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)


def test_at_behavior_policy_equals_on_policy_grpo_gradient():
    model = tiny_model(5)
    rng = np.random.default_rng(4)
    traj = make_traj(rng, [1, 1, 0, 0, 1])
    with torch.no_grad():
        traj.behavior_logprobs = [seq_logprobs(model, traj.prompt_token_ids, r).tolist() for r in traj.responses]
    # On-policy GRPO: -(1/K) sum_k A_k mean_t grad log pi(y_kt): no ratio anywhere.
    r = np.array(traj.rewards, dtype=np.float64)
    adv = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
    loss = -sum(adv[k] * seq_logprobs(model, traj.prompt_token_ids, resp).mean()
                for k, resp in enumerate(traj.responses)) / len(traj.responses)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    comp, proj = computer_for(model, ProjectionSpec(kind="identity", kept_fraction=1.0))
    want = proj.project([(n, g[None].float()) for (n, _), g in zip(model.named_parameters(), grads)])[0]
    np.testing.assert_allclose(comp.compute(traj).vector, want.numpy(), rtol=2e-4, atol=1e-7)


def test_zero_advantage_is_exactly_zero_and_skips_backward():
    model = tiny_model()
    comp, proj = computer_for(model, ProjectionSpec(kind="sjlt", dim=64))
    for rewards in ([1, 1, 1, 1], [0, 0, 0], [1]):
        res = comp.compute(make_traj(np.random.default_rng(0), rewards))
        assert res.status == "zero_advantage"
        assert res.vector.shape == (64,) and not np.any(res.vector)
        assert res.raw_norm == 0.0
    assert all(p.grad is None for p in model.parameters())


def test_nonfinite_and_truncated_statuses():
    model = tiny_model()
    comp, _ = computer_for(model, ProjectionSpec(kind="sjlt", dim=32))
    rng = np.random.default_rng(0)
    bad = make_traj(rng, [1, 0])
    bad.behavior_logprobs = [[-math.inf] * len(r) for r in bad.responses]
    res = comp.compute(bad)
    assert res.status == "nonfinite" and not np.any(res.vector)
    short, _ = computer_for(tiny_model(), ProjectionSpec(kind="sjlt", dim=32), max_length=8)
    long = make_traj(rng, [1, 0], prompt_len=6)
    long.responses = [[5] * 6, [6] * 6]
    long.behavior_logprobs = [[-4.0] * 6, [-4.0] * 6]
    res = short.compute(long)
    assert res.status == "truncated" and np.any(res.vector)
    long.prompt_token_ids = [3] * 9
    assert short.compute(long).status == "truncated"


EOS = 2


def _ending_in_eos(rng, rewards):
    """Responses that end with the end-of-sequence token, as the collect step stores them."""
    traj = make_traj(rng, rewards)
    traj.responses = [[t for t in r if t != EOS] + [EOS] for r in traj.responses]
    traj.behavior_logprobs = [list(rng.normal(-4.6, 0.3, len(r))) for r in traj.responses]
    return traj


def test_the_eos_token_counts_in_the_response_length():
    model = tiny_model(2)
    model.config.eos_token_id = EOS
    model.generation_config.eos_token_id = EOS
    traj = _ending_in_eos(np.random.default_rng(6), [1, 0, 0, 1, 1])
    traj.responses[0] = [EOS]  # a response that is only the EOS token
    traj.behavior_logprobs[0] = [-3.0]
    spec = ProjectionSpec(kind="identity", kept_fraction=1.0)
    comp, proj = computer_for(model, spec)
    got = comp.compute(traj)
    # brute force: every response token, EOS included, in the log-prob sum and in |y| of the mean
    want = proj.project([(n, g[None].float()) for n, g in brute_force_grad(model, traj)])[0].numpy()
    assert got.status == "ok"
    np.testing.assert_allclose(got.vector, want, rtol=2e-4, atol=1e-7)
    assert got.n_tokens == sum(len(traj.prompt_token_ids) + len(r) for r in traj.responses)


def test_a_failed_reward_counts_as_incorrect_never_correct():
    model = tiny_model(4)
    rng = np.random.default_rng(8)
    traj = make_traj(rng, [1, None, 0, None, 1])
    comp, proj = computer_for(model, ProjectionSpec(kind="identity", kept_fraction=1.0))
    got = comp.compute(traj)
    as_zero = make_traj(np.random.default_rng(8), [1, 0, 0, 0, 1])  # the same draws, None scored 0
    want = proj.project([(n, g[None].float()) for n, g in brute_force_grad(model, as_zero)])[0].numpy()
    np.testing.assert_allclose(got.vector, want, rtol=2e-4, atol=1e-7)
    assert got.reward_mean == pytest.approx(0.4)
    only_failed_and_correct = make_traj(rng, [1, None, 1])  # None as 1 would make every advantage zero
    assert comp.compute(only_failed_and_correct).status == "ok"


def test_a_response_that_exactly_fills_the_context_is_not_truncated():
    model = tiny_model()
    comp, proj = computer_for(model, ProjectionSpec(kind="identity", kept_fraction=1.0), max_length=8)
    traj = make_traj(np.random.default_rng(5), [1, 0, 1], prompt_len=5)
    traj.responses = [[4, 5, 6], [7, 8], [9, 10, 11]]  # 5 + 3 = 8 tokens: exactly the context
    traj.behavior_logprobs = [[-4.0] * len(r) for r in traj.responses]
    got = comp.compute(traj)
    want = proj.project([(n, g[None].float()) for n, g in brute_force_grad(model, traj)])[0].numpy()
    assert got.status == "ok"
    np.testing.assert_allclose(got.vector, want, rtol=2e-4, atol=1e-7)
    traj.responses[2] = [9, 10, 11, 12]  # one token over
    traj.behavior_logprobs[2] = [-4.0] * 4
    assert comp.compute(traj).status == "truncated"
    traj.prompt_token_ids = [3] * 7
    traj.responses = [[4], [5], [6]]
    traj.behavior_logprobs = [[-4.0]] * 3
    assert comp.compute(traj).status == "ok"  # 7 + 1 = 8: still exactly fits


def test_filter_limits_gradients_to_covered_parameters():
    model = tiny_model()
    spec = ProjectionSpec(kind="identity", kept_fraction=1.0, include=r"mlp")
    comp, proj = computer_for(model, spec)
    assert all("mlp" in n for n in proj.param_names)
    assert all(p.requires_grad == ("mlp" in n) for n, p in model.named_parameters())
    res = comp.compute(make_traj(np.random.default_rng(3), [1, 0, 0]))
    assert res.vector.shape == (proj.out_dim,) and np.any(res.vector)


def test_group_advantages_match_numpy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        r = rng.integers(0, 2, 8).astype(float) * rng.random()
        got = group_advantages(torch.tensor(r)).numpy()
        want = np.zeros_like(r) if np.all(r == r[0]) else (r - r.mean()) / (r.std(ddof=1) + 1e-4)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


# ---------------------------------------------------------------- all-equal groups: no forward at all


class ForwardCount:
    """How many times ``model(...)`` ran (every pass of either computer calls the whole model)."""

    def __init__(self, model):
        self.n = 0
        model.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        self.n += 1


def brute_force_diagnostics(model, traj) -> dict:
    """ESS, ESS/K, p_theta, std_theta and log mean weight of the group, in plain Python floats from
    log w_k = sum_t (log pi(y_kt) - log beta(y_kt)), log pi one unpadded sequence at a time."""
    with torch.no_grad():
        lw = [float((seq_logprobs(model, traj.prompt_token_ids, r) - torch.tensor(b, dtype=torch.float64)).sum())
              for r, b in zip(traj.responses, traj.behavior_logprobs)]
    top, k = max(lw), len(lw)
    w = [math.exp(x - top) for x in lw]
    wbar = [x / sum(w) for x in w]
    r = [float(np.float32(x)) for x in traj.rewards]  # the computers read rewards as float32
    p = sum(a * b for a, b in zip(wbar, r))
    ess = sum(w) ** 2 / sum(x * x for x in w)
    return {"ess": ess, "ess_fraction": ess / k, "p_theta": p,
            "std_theta": math.sqrt(sum(a * (b - p) ** 2 for a, b in zip(wbar, r))),
            "log_mean_weight": top + math.log(sum(w) / k)}


def assert_diagnostics(rec, want, rel):
    for name, value in want.items():
        assert getattr(rec, name) == pytest.approx(value, rel=rel, abs=1e-12), name


ALL_EQUAL = ([1, 1, 1, 1], [0, 0, 0], [0.5, 0.5], [1])


@pytest.mark.parametrize("advantage", ["behavior", "theta"])
def test_an_all_equal_group_runs_no_forward_and_keeps_p_theta_and_std_theta(advantage):
    """Its gradient is zero at every theta under both estimators (theta_coefficients is exactly zero
    when every reward is equal), so no pass: p_theta (the common reward) and std_theta (0) are what
    the weights would give whatever they are; ESS, ESS/K and the log mean weight are absent."""
    model = tiny_model()
    comp, _ = computer_for(model, ProjectionSpec(kind="sjlt", dim=64), advantage=advantage)
    calls = ForwardCount(model)
    rng = np.random.default_rng(0)
    trajs = [make_traj(rng, rewards, noise=1.0) for rewards in ALL_EQUAL]
    got = comp.compute_many(trajs)
    assert calls.n == 0
    reference = tiny_model()  # the same weights, counted apart
    for res, traj in zip(got, trajs):
        assert res.status == "zero_advantage" and not np.any(res.vector) and res.raw_norm == 0.0
        want = brute_force_diagnostics(reference, traj)
        assert len(traj.rewards) == 1 or want["ess_fraction"] < 0.95  # unequal weights: a forward would tell
        assert res.p_theta == float(np.float32(traj.rewards[0])) == pytest.approx(want["p_theta"], rel=1e-12)
        assert res.std_theta == 0.0 and want["std_theta"] == pytest.approx(0.0, abs=1e-12)
        assert res.ess is None and res.ess_fraction is None and res.log_mean_weight is None
    assert all(p.grad is None for p in model.parameters())
    comp.compute(make_traj(rng, [1, 0, 0]))
    assert calls.n >= 1  # the count sees the computer's passes


def test_informative_groups_beside_all_equal_ones_keep_their_vectors_and_diagnostics():
    model = tiny_model(2)
    comp, proj = computer_for(model, ProjectionSpec(kind="identity", kept_fraction=1.0), token_budget=10)
    rng = np.random.default_rng(5)
    trajs = [make_traj(rng, rewards, noise=1.0) for rewards in ([1, 0, 1, 0], [1, 1, 1], [0, 1, 1], [0, 0, 0, 0])]
    got = comp.compute_many(trajs)
    assert [r.status for r in got] == ["ok", "zero_advantage", "ok", "zero_advantage"]
    for res, traj in zip(got, trajs):
        if res.status != "ok":
            continue
        want = proj.project([(n, g[None].float()) for n, g in brute_force_grad(tiny_model(2), traj)])[0].numpy()
        np.testing.assert_allclose(res.vector, want, rtol=2e-4, atol=1e-7)
        assert_diagnostics(res, brute_force_diagnostics(tiny_model(2), traj), rel=1e-5)


def test_the_theta_estimator_weighs_a_mixed_group_it_silences_once():
    """A mixed group the theta estimator gives no signal (a fresh group at theta would likely be all
    failed): its one forward pass gives both the coefficients and the stored diagnostics."""
    from support.ess import group, tiny_model as ess_model

    model = ess_model()
    comp, _ = computer_for(model, ProjectionSpec(kind="sjlt", dim=8), advantage="theta")
    calls = ForwardCount(model)
    # the only pass has weight e^-12 against the failures': p_theta ~ 3e-6, 1 - p^4 - (1-p)^4 ~ 1e-5 < 1/2
    traj = group(model, np.random.default_rng(4), [1, 0, 0, 0], shifts=[12.0, 0, 0, 0])
    calls.n = 0
    res = comp.compute(traj)
    assert res.status == "zero_advantage" and calls.n == 1  # one micro-batch, one pass (it used to be two)
    assert_diagnostics(res, brute_force_diagnostics(ess_model(), traj), rel=1e-5)
    assert res.p_theta < 1e-5 and res.ess_fraction == pytest.approx(0.75, rel=1e-4)  # three equal weights of four


def test_batched_all_equal_groups_run_no_forward_and_informative_ones_are_unchanged(monkeypatch):
    """The batched computer (both layouts): a call of all-equal groups runs the model not once; in a
    call with informative groups, theirs equal the projection of the brute-force gradient."""
    from cropi.gradients import make_computer
    from cropi.gradients.batched import BatchedComputer
    from support.gradients import LAYOUTS, use_layout

    spec = ProjectionSpec(kind="factored", factor_in=3, factor_out=4, seed=5)
    rng = np.random.default_rng(9)
    trajs = [make_traj(rng, rewards, prompt_len=n, noise=1.0)
             for rewards, n in (([1, 0, 1, 0], 3), ([1, 1, 1], 6), ([0, 1, 1], 5), ([0, 0, 0, 0, 0], 4), ([1], 2))]
    for i, t in enumerate(trajs):
        t.prompt_id = f"p{i}"
    flat = [t for t in trajs if len(set(t.rewards)) == 1]
    for layout in LAYOUTS:
        use_layout(monkeypatch, layout)
        model = double_model()
        comp = make_computer(model, make_projector(spec, {n: tuple(p.shape) for n, p in model.named_parameters()}))
        assert isinstance(comp, BatchedComputer)
        calls = ForwardCount(model)
        got = comp.compute_many(flat)
        assert calls.n == 0
        for res, traj in zip(got, flat):
            assert res.status == "zero_advantage" and not np.any(res.vector)
            assert res.p_theta == float(traj.rewards[0]) and res.std_theta == 0.0
            assert res.ess is None and res.ess_fraction is None and res.log_mean_weight is None
        records = comp.compute_many(trajs)
        vectors = comp.vectors([comp._prepare(t) for t in trajs])
        assert calls.n > 0 and [r.status for r in records] == ["ok", "zero_advantage", "ok", "zero_advantage",
                                                               "zero_advantage"]
        for i, (res, traj) in enumerate(zip(records, trajs)):
            if res.status != "ok":
                assert res.ess is None and not vectors[i].any()
                continue
            grads = dict(brute_force_grad(double_model(), traj))
            want = comp.projector.project((n, grads[n][None]) for n in comp.projector.param_names)[0]
            # the projector forms the product in float32 (as test_factored's formed-gradient check allows)
            torch.testing.assert_close(vectors[i], want.to(vectors.dtype), rtol=1e-5, atol=1e-6)
            assert_diagnostics(res, brute_force_diagnostics(double_model(), traj), rel=1e-6)


def double_model(seed=0):
    model = tiny_model(seed).double()
    model.config._attn_implementation = "sdpa"  # float64 eager turns left padding's masked rows into NaN
    return model


# ---------------------------------------------------------------- checkpoint loading

class _Payload:
    """Unpickling this creates a file: proof that a pickle was (or was not) loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_only_checkpoint_is_refused_and_never_unpickled(tmp_path):
    import pickle

    from cropi.models.loading import ModelLoadError, load_causal_lm

    folder = tmp_path / "ckpt"
    model = tiny_model()
    model.save_pretrained(folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # the layout older checkpoints have
    assert (folder / "pytorch_model.bin").is_file() and not list(folder.glob("*.safetensors"))
    with pytest.raises(ModelLoadError, match=r"pickle files \(pytorch_model.bin\).*safetensors"):
        load_causal_lm(folder)
    marker = tmp_path / "unpickled"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.raises(ModelLoadError, match="never loads"):
        load_causal_lm(folder)
    assert not marker.exists()
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(ModelLoadError, match="has no weights"):
        load_causal_lm(folder)


def test_safetensors_are_loaded_even_beside_a_pickle(tmp_path):
    from cropi.models.loading import load_causal_lm

    folder = tmp_path / "ckpt"
    model = tiny_model(1)
    model.save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle at all")
    got = load_causal_lm(folder)
    for (n, p), (_, q) in zip(model.named_parameters(), got.named_parameters()):
        assert torch.equal(p, q), n
