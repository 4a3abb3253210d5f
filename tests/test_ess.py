"""Effective sample size of a prompt's sequence-level importance weights, against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from cropi.errors import MismatchError
from cropi.gradients import GradientComputer
from cropi.gradients.popi import effective_sample_size, sequence_log_weights
from cropi.projection import ProjectionSpec, make_projector
from cropi.store import CheckpointRef, GradientStore
from cropi.store.types import gradient_schema, legacy_schema
from cropi.store.sharded import ShardedDataset
from support.ess import group, teacher_forced, tiny_model
from support.gradients import Traj

VOCAB = 61
CKPT = CheckpointRef(name="ckpt", fingerprint="fp")
SPEC = {"kind": "sjlt", "dim": 8, "seed": 0, "spec_id": "s8"}


def test_ess_worked_three_response_example():
    # w = (1, 2, 3): (1 + 2 + 3)^2 / (1 + 4 + 9) = 36 / 14
    assert effective_sample_size(np.log([1.0, 2.0, 3.0])) == pytest.approx(36 / 14, rel=1e-12)
    # the same weights scaled by e^1000 (overflow in linear space) and by e^-1000 (underflow)
    for shift in (1000.0, -1000.0):
        assert effective_sample_size(np.log([1.0, 2.0, 3.0]) + shift) == pytest.approx(36 / 14, rel=1e-9)


def test_ess_is_k_for_equal_weights_and_near_one_when_one_dominates():
    assert effective_sample_size(np.zeros(8)) == pytest.approx(8.0, rel=1e-12)
    assert effective_sample_size(np.full(5, -3.7)) == pytest.approx(5.0, rel=1e-12)
    # one weight e^20 times the others: (e^20 + 3)^2 / (e^40 + 3) = 1 + 6 e^-20 + O(e^-40)
    ess = effective_sample_size([20.0, 0.0, 0.0, 0.0])
    assert ess == pytest.approx((math.exp(20) + 3) ** 2 / (math.exp(40) + 3), rel=1e-9)
    assert 1.0 < ess < 1.0 + 1e-7


def test_ess_undefined_cases():
    assert effective_sample_size([]) is None
    assert effective_sample_size([0.0, -math.inf]) is None
    assert effective_sample_size([0.0, math.nan]) is None
    assert effective_sample_size([1.5]) == pytest.approx(1.0)


def test_sequence_log_weights_sum_masked_tokens_only():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-9.0, -0.1, -0.2]])
    beh = torch.tensor([[-1.5, -1.0, -0.5], [0.0, -0.3, -0.3]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])  # row 2: the first position is padding
    got = sequence_log_weights(logp, beh, mask)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx([0.5 - 1.0 + 0.0, 0.2 + 0.1])


# ---------------------------------------------------------------- in the gradient computer

def computer(model):
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return GradientComputer(model, make_projector(ProjectionSpec(kind="sjlt", dim=8), shapes))


# A group whose rewards are all equal used to get a forward pass for its ESS alone; scoring now skips
# it (issue 32: its gradient is zero at every theta), so its ESS is absent, whatever the weights.
@pytest.mark.parametrize("rewards", [[1, 0, 1, 0, 0], [1, 1, 1, 1, 1]], ids=["ok", "zero_advantage"])
def test_computer_ess_is_k_at_theta_equal_beta(rewards):
    model = tiny_model()
    res = computer(model).compute(group(model, np.random.default_rng(1), rewards))
    if len(set(rewards)) == 1:
        assert res.status == "zero_advantage" and res.ess is None and res.ess_fraction is None
        return
    assert res.status == "ok"
    assert res.ess == pytest.approx(5.0, rel=1e-5) and res.ess_fraction == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("rewards", [[1, 0, 0], [0, 0, 0]], ids=["ok", "zero_advantage"])
def test_computer_ess_matches_hand_weights(rewards):
    # log beta lowered by (0, -ln 2, -ln 3) in total per response: w = (1, 2, 3) -> ESS 36/14
    model = tiny_model()
    res = computer(model).compute(group(model, np.random.default_rng(2), rewards, shifts=[0, -math.log(2), -math.log(3)]))
    if len(set(rewards)) == 1:  # no forward pass (see above): absent, not 36/14
        assert res.status == "zero_advantage" and res.ess is None and res.ess_fraction is None
        assert res.log_mean_weight is None and res.p_theta == 0.0 and res.std_theta == 0.0
        return
    assert res.ess == pytest.approx(36 / 14, rel=1e-5)
    assert res.ess_fraction == pytest.approx(36 / 14 / 3, rel=1e-5)


def test_computer_ess_near_one_when_one_response_dominates():
    model = tiny_model()
    res = computer(model).compute(group(model, np.random.default_rng(3), [1, 0, 1, 0], shifts=[-30, 0, 0, 0]))
    assert res.ess == pytest.approx(1.0, abs=1e-9) and res.ess_fraction == pytest.approx(0.25, abs=1e-9)



def test_weight_diagnostics_match_hand_weights_in_every_layout(monkeypatch):
    """The refresh weighs the all-equal groups scoring skipped (``weight_diagnostics``) in the gradients' own
    layout: many prompts a pass, packed rows and plain rows, a response drawn twice packed once, chunks of
    prompts. Behavior log-probs lowered by (0, ln 2, ln 3) in total make w = (1, 2, 3) in every group, whatever
    its layout: ESS/K = (36/14)/3, mean weight 2, p_theta the weighted pass rate. A prompt over the context
    gets none. A token read at the wrong position, a dropped or doubled response, or one group's weights
    written to another's would move them."""
    from types import SimpleNamespace

    from cropi.gradients import LossOptions, batched
    from cropi.gradients.packing import ModelShape
    from support.gradients import VOCAB

    model, rng = tiny_model(), np.random.default_rng(4)
    shifts = [0.0, -math.log(2), -math.log(3)]

    def shifted(pid, prompt, responses, rewards):
        behavior = [[b + s / len(r) for b in teacher_forced(model, prompt, r)] for r, s in zip(responses, shifts)]
        return Traj(pid, prompt, responses, behavior, rewards)

    short = [shifted(f"short{i}", *(lambda g: (g.prompt_token_ids, g.responses))(group(model, rng, [0, 0, 0])), r)
             for i, r in enumerate([[1, 1, 1], [0, 0, 0], [1, 0, 0]])]
    long_responses = [rng.integers(1, VOCAB, 25).tolist() for _ in range(3)]
    long = shifted("long", rng.integers(1, VOCAB, 2).tolist(), long_responses, [0, 1, 0])
    twice = rng.integers(1, VOCAB, 3).tolist()
    repeated = shifted("repeated", rng.integers(1, VOCAB, 6).tolist(), [twice, twice, [5, 6]], [1, 1, 1])
    over = Traj("over", rng.integers(1, VOCAB, 61).tolist(), [[1, 2]] * 3, [[-1.0, -1.0]] * 3, [1, 1, 1])
    trajs = short + [long, repeated, over]
    options = LossOptions(max_length=60)

    fitted = [SimpleNamespace(prompt=t.prompt_token_ids, responses=t.responses) for t in trajs[:5]]
    kinds = {packed for packed, _ in batched.plan_passes(fitted, range(5), ModelShape.of(model), options.token_budget)}
    assert kinds == {True, False}  # both layouts are exercised
    monkeypatch.setattr(batched, "PROMPTS_PER_CALL", 1)  # chunks of 4 prompts: the loop crosses one
    out = batched.weight_diagnostics(model, iter(trajs), options)

    assert set(out) == {t.prompt_id for t in trajs}
    assert all(v is None for v in out["over"].values())
    for t in trajs[:5]:
        d = out[t.prompt_id]
        p = sum(w * r for w, r in zip([1, 2, 3], t.rewards)) / 6
        assert d["ess_fraction"] == pytest.approx(36 / 14 / 3, rel=1e-4), t.prompt_id
        assert d["log_mean_weight"] == pytest.approx(math.log(2), abs=1e-4), t.prompt_id
        assert d["p_theta"] == pytest.approx(p, abs=1e-4), t.prompt_id


# ---------------------------------------------------------------- in the store

def test_a_zero_advantage_row_stores_p_theta_and_std_theta_and_null_ess(tmp_path):
    """The computer's records as the gradients job writes them: the all-equal group's unknown ESS,
    ESS/K and log mean weight read back as NaN (unknown), its p_theta and std_theta as values."""
    model = tiny_model()
    comp = computer(model)
    records = [comp.compute(group(model, np.random.default_rng(i), r)) for i, r in enumerate(([1, 0, 1], [1, 1, 1]))]
    records[1].prompt_id = "flat"
    split = GradientStore(str(tmp_path)).split(CKPT, SPEC, "pool", dim=8, dtype="float32")
    with split.writer("w0") as w:
        for rec in records:
            w.write(rec)
    t = GradientStore(str(tmp_path)).open_split("ckpt", "s8", "pool").read()
    assert t.prompt_ids == ["p", "flat"] and t.columns["status"].tolist() == ["ok", "zero_advantage"]
    assert np.isfinite([t.ess[0], t.ess_fraction[0], t.log_mean_weight[0]]).all()
    assert np.isnan([t.ess[1], t.ess_fraction[1], t.log_mean_weight[1]]).all()
    assert t.p_theta[1] == 1.0 and t.std_theta[1] == 0.0
    assert t.p_theta[0] == pytest.approx(2 / 3, rel=1e-5)  # theta = beta: the plain mean


def test_ess_round_trips_through_the_store(tmp_path):
    split = GradientStore(str(tmp_path)).split(CKPT, SPEC, "pool", dim=8, dtype="float32")
    with split.writer("w0", rows_per_shard=2) as w:
        for i, (ess, frac) in enumerate([(8.0, 1.0), (1.25, 0.15625), (None, None)]):
            w.append(f"p{i}", np.full(8, i, np.float32), 1.0, 8, 0.5, 0.5, 10, "ok", ess=ess, ess_fraction=frac)
    again = GradientStore(str(tmp_path)).open_split("ckpt", "s8", "pool").read()
    assert again.ess[:2].tolist() == [8.0, 1.25] and math.isnan(again.ess[2])
    assert again.ess_fraction[:2].tolist() == [1.0, 0.15625] and math.isnan(again.ess_fraction[2])
    assert again.get(["p1"]).ess.tolist() == [1.25]


def test_split_stored_before_the_ess_columns_still_reads_and_resumes(tmp_path):
    store = GradientStore(str(tmp_path))
    path = store._dir("ckpt", "s8", "pool")
    identity = {"kind": "gradients", "checkpoint": CKPT.model_dump(), "spec": SPEC, "split": "pool",
                "dim": 8, "dtype": "float32", "extra": {}}
    old = ShardedDataset(path, identity, "ipc", legacy_schema(gradient_schema(8, "float32")), filesystem=store.fs)
    assert "ess" not in old.schema.names
    row = {"prompt_id": ["a"], "vector": pa.array([[1.0] * 8], pa.list_(pa.float32(), 8)), "raw_norm": [1.0],
           "n_responses": pa.array([2], pa.int32()), "reward_mean": [0.5], "reward_std": [0.7],
           "n_tokens": [9], "status": ["ok"]}
    old.writer("w0").commit(pa.table(row))
    # reopened by today's code: it resumes without the columns, and reads them as absent
    split = store.split(CKPT, SPEC, "pool", dim=8, dtype="float32")
    with split.writer("w0") as w:
        w.append("b", np.zeros(8), 0.0, 2, 1.0, 0.0, 9, "zero_advantage", ess=2.0, ess_fraction=1.0)
    table = store.open_split("ckpt", "s8", "pool").read()
    assert table.prompt_ids == ["a", "b"] and table.ess is None and table.ess_fraction is None
    # another identity is still refused, with the identity error (not a schema one)
    with pytest.raises(MismatchError, match="fingerprint"):
        store.split(CheckpointRef(name="ckpt", fingerprint="other"), SPEC, "pool", dim=8, dtype="float32")
