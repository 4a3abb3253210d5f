"""Importance-weighted group statistics (p_theta, std_theta) and the 'theta' estimator, against
hand computations and an independently written brute-force loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from cropi.gradients import LossOptions
from cropi.gradients.popi import mixed_probability, theta_coefficients, weighted_group_stats
from cropi.projection import ProjectionSpec
from cropi.store import CheckpointRef, GradientStore
from cropi.store.sharded import ShardedDataset
from cropi.store.types import gradient_schema, legacy_schema
from support.ess import group  # a group whose behavior log-probs are the model's own, shifted by known amounts
from support.ess import tiny_model as ess_model
from support.gradients import computer_for, make_traj, seq_logprobs, tiny_model

IDENTITY = ProjectionSpec(kind="identity", kept_fraction=1.0)


def test_weighted_stats_worked_example_and_overflow_sized_log_weights():
    # w = (1, 2, 3), R = (1, 0, 1): p = 4/6; var = (1 (1/3)^2 + 2 (2/3)^2 + 3 (1/3)^2) / 6 = 2/9
    for shift in (0.0, 1000.0, -1000.0, 5000.0):
        p, std = weighted_group_stats(np.log([1.0, 2.0, 3.0]) + shift, [1.0, 0.0, 1.0])
        assert p == pytest.approx(2 / 3, rel=1e-12) and std == pytest.approx(math.sqrt(2 / 9), rel=1e-12)
    # one weight e^800 times the rest: p is that response's reward, the spread vanishes
    p, std = weighted_group_stats([800.0, 0.0, 0.0], [0.0, 1.0, 1.0])
    assert p == pytest.approx(2 * math.exp(-800), abs=1e-300) and std < 1e-100


def test_weighted_stats_at_theta_equal_beta_are_plain_mean_and_biased_std():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    p, std = weighted_group_stats(np.full(8, -3.7), rewards)
    assert p == pytest.approx(np.mean(rewards), rel=1e-12)
    assert std == pytest.approx(np.std(rewards, ddof=0), rel=1e-12)


def test_weighted_stats_undefined_cases():
    assert weighted_group_stats([], []) is None
    assert weighted_group_stats([0.0, -math.inf], [1.0, 0.0]) is None
    assert weighted_group_stats([0.0, math.nan], [1.0, 0.0]) is None
    with pytest.raises(ValueError, match="2 log weights but 3 rewards"):
        weighted_group_stats([0.0, 0.0], [1.0, 0.0, 1.0])


def test_theta_coefficients_hand_values_and_zero_cases():
    # w = (1, 2, 3), R = (1, 0, 1): c_k = 3 (w_k / 6) (R_k - 2/3) / (sqrt(2/9) + 1e-4)
    got = theta_coefficients(torch.tensor([1.0, 0.0, 1.0]), torch.log(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)) - 700)
    s = math.sqrt(2 / 9) + 1e-4
    assert got.tolist() == pytest.approx([3 * (1 / 6) * (1 / 3) / s, 3 * (2 / 6) * (-2 / 3) / s,
                                          3 * (3 / 6) * (1 / 3) / s], rel=1e-12)
    assert float(got.sum()) == pytest.approx(0.0, abs=1e-12)  # centred under the weights
    assert theta_coefficients(torch.ones(4), torch.tensor([0.0, 3.0, -2.0, 1.0])).tolist() == [0.0] * 4


def test_theta_coefficients_vanish_when_a_fresh_group_would_be_all_equal():
    rewards = torch.tensor([1.0] * 7 + [0.0])
    # equal weights: p = 7/8, 1 - p^8 - (1-p)^8 = 0.656 >= 1/2: the group keeps its signal
    assert torch.any(theta_coefficients(rewards, torch.zeros(8, dtype=torch.float64)) != 0)
    # the failure down-weighted by e^-3: p = 7 / (7 + e^-3) = 0.9929, 1 - p^8 - (1-p)^8 = 0.055 < 1/2
    lw = torch.tensor([0.0] * 7 + [-3.0], dtype=torch.float64)
    p = 7 / (7 + math.exp(-3))
    assert mixed_probability(p, 8) == pytest.approx(1 - p ** 8 - (1 - p) ** 8) and mixed_probability(p, 8) < 0.5
    assert theta_coefficients(rewards, lw).tolist() == [0.0] * 8
    # the boundary: K = 2, p = 1/2 is exactly 1/2 and keeps its signal
    assert mixed_probability(0.5, 2) == 0.5 and torch.any(theta_coefficients(torch.tensor([1.0, 0.0]), torch.zeros(2)) != 0)
    assert torch.isnan(theta_coefficients(torch.tensor([1.0, 0.0]), torch.tensor([0.0, -math.inf]))).all()


# ---------------------------------------------------------------- in the gradient computer

def test_computer_stores_p_theta_and_std_theta():
    model = ess_model()
    comp, _ = computer_for(model, ProjectionSpec(kind="sjlt", dim=8))
    # theta = beta: the plain mean and biased std, for an informative and a zero-advantage group
    for rewards in ([1, 0, 1, 0, 0], [1, 1, 1, 1, 1]):
        res = comp.compute(group(model, np.random.default_rng(1), rewards))
        assert res.p_theta == pytest.approx(np.mean(rewards), abs=1e-6)
        assert res.std_theta == pytest.approx(np.std(rewards), abs=1e-5)
    # log beta lowered by (0, -ln 2, -ln 3) in total per response: w = (1, 2, 3)
    res = comp.compute(group(model, np.random.default_rng(2), [1, 0, 1], shifts=[0, -math.log(2), -math.log(3)]))
    assert res.p_theta == pytest.approx(2 / 3, rel=1e-5) and res.std_theta == pytest.approx(math.sqrt(2 / 9), rel=1e-5)


def brute_force_theta_grad(model, traj):
    """-(sum_k wbar_k A_k mean_t log pi(y_kt)), with wbar and A from plain Python floats (weights
    constants), one unpadded sequence at a time."""
    logps = [seq_logprobs(model, traj.prompt_token_ids, r) for r in traj.responses]
    lw = [float((lp.detach() - torch.tensor(b, dtype=torch.float64)).sum())
          for lp, b in zip(logps, traj.behavior_logprobs)]
    top = max(lw)
    w = [math.exp(x - top) for x in lw]
    wbar = [x / sum(w) for x in w]
    r = [float(x) for x in traj.rewards]
    p = sum(a * b for a, b in zip(wbar, r))
    std = math.sqrt(sum(a * (b - p) ** 2 for a, b in zip(wbar, r)))
    loss = -sum(wbar[k] * (r[k] - p) / (std + 1e-4) * logps[k].mean() for k in range(len(r)))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return [(n, g) for (n, _), g in zip(model.named_parameters(), grads)]


@pytest.mark.parametrize("budget", [8, 10_000])
def test_theta_gradient_matches_brute_force(budget):
    model = tiny_model()
    traj = make_traj(np.random.default_rng(1), [1, 0, 1, 0, 0, 1], noise=1.0)
    comp, proj = computer_for(model, IDENTITY, advantage="theta", token_budget=budget)
    got = comp.compute(traj)
    want = proj.project([(n, g[None].float()) for n, g in brute_force_theta_grad(model, traj)])[0].numpy()
    assert got.status == "ok" and got.ess_fraction < 0.9  # the weights really differ
    np.testing.assert_allclose(got.vector, want, rtol=2e-4, atol=1e-7)


def test_theta_estimator_at_theta_equal_beta_is_cropi_up_to_the_std_convention():
    model = tiny_model(5)
    traj = make_traj(np.random.default_rng(4), [1, 1, 0, 0, 1])
    with torch.no_grad():
        traj.behavior_logprobs = [seq_logprobs(model, traj.prompt_token_ids, r).tolist() for r in traj.responses]
    cropi, _ = computer_for(model, IDENTITY)
    theta, _ = computer_for(model, IDENTITY, advantage="theta")
    a, b = cropi.compute(traj).vector, theta.compute(traj).vector
    r = np.array(traj.rewards, dtype=np.float64)
    # same direction; lengths differ by (unbiased std + eps) / (biased std + eps)
    np.testing.assert_allclose(b, a * (r.std(ddof=1) + 1e-4) / (r.std() + 1e-4), rtol=2e-4, atol=1e-7)


def test_theta_estimator_keeps_zero_advantage_and_refuses_a_clip():
    model = tiny_model()
    comp, _ = computer_for(model, IDENTITY, advantage="theta")
    res = comp.compute(make_traj(np.random.default_rng(0), [0, 0, 0]))
    assert res.status == "zero_advantage" and not res.vector.any() and res.p_theta == 0.0
    with pytest.raises(ValidationError, match="clip_eps clips POPI's token ratios"):
        LossOptions(advantage="theta", clip_eps=0.2)
    with pytest.raises(ValidationError):
        LossOptions(advantage="fresh")
    assert LossOptions().advantage == "behavior"


# ---------------------------------------------------------------- in the store

CKPT = CheckpointRef(name="ckpt", fingerprint="fp")
SPEC = {"kind": "sjlt", "dim": 8, "seed": 0, "spec_id": "s8"}


def test_p_theta_round_trips_and_an_ess_era_split_resumes_without_it(tmp_path):
    store = GradientStore(str(tmp_path / "new"))
    with store.split(CKPT, SPEC, "pool", dim=8, dtype="float32").writer("w0") as w:
        w.append("a", np.ones(8), 1.0, 8, 0.5, 0.5, 10, "ok", ess=8.0, ess_fraction=1.0, p_theta=0.75, std_theta=0.25)
        w.append("b", np.ones(8), 1.0, 8, 0.5, 0.5, 10, "ok")
    t = store.open_split("ckpt", "s8", "pool").read()
    assert t.p_theta[0] == 0.75 and t.std_theta[0] == 0.25 and math.isnan(t.p_theta[1])

    old_store = GradientStore(str(tmp_path / "old"))
    identity = {"kind": "gradients", "checkpoint": CKPT.model_dump(), "spec": SPEC, "split": "pool",
                "dim": 8, "dtype": "float32", "extra": {}}
    ShardedDataset(old_store._dir("ckpt", "s8", "pool"), identity, "ipc",
                   legacy_schema(gradient_schema(8, "float32"), keep=2), filesystem=old_store.fs)
    split = old_store.split(CKPT, SPEC, "pool", dim=8, dtype="float32")  # reopened by today's code
    assert split.dataset.schema.names[-2:] == ["ess", "ess_fraction"]
    with split.writer("w1") as w:
        w.append("c", np.ones(8), 1.0, 8, 0.5, 0.5, 10, "ok", ess=4.0, ess_fraction=0.5, p_theta=0.5, std_theta=0.5)
    t = old_store.open_split("ckpt", "s8", "pool").read()
    assert t.ess.tolist() == [4.0] and t.p_theta is None and t.std_theta is None
