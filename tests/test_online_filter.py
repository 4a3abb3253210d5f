"""The online filter (I-PPO, IIF): influences against brute-force full gradients, the policies' drop
sets on hand-made influences, and a filter that drops nothing leaving the update bitwise unchanged."""

from __future__ import annotations

import json
import random
import zlib

import pytest
import torch

from cropi.data import write_jsonl, write_verl_parquet
from cropi.gradients.engine import GradientEngine, Responses
from cropi.models import build_tiny_model, load_causal_lm
from cropi.projection import ProjectionSpec
from cropi.rewards import register_reward
from cropi.tasks.skills import make_splits
from cropi.trainers import TrainerOptionsError, make_trainer
from cropi.trainers.filters import OnlineFilter, OnlineFilterOptions, drop_set

NOISY = "test_online_noisy"
IDENTITY = ProjectionSpec(kind="identity", kept_fraction=1.0)


@register_reward(NOISY, replace=True)
def _text_parity(text: str, answer: str) -> float:
    # a random tiny model rarely earns a task reward; a hash of the text gives every group variance,
    # so influences of both signs appear
    return float(zlib.crc32(text.encode()) % 2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("online") / "base", seed=0).resolve()


# ---------------------------------------------------------------- brute force, one response at a time

SEQS = [([5, 9, 11], [20, 21, 22, 23]), ([5, 9, 11], [30]), ([7, 8], [40, 41]), ([7, 8], [50, 51, 52]),
        ([3, 4, 5, 6, 7], [60, 61]), ([3, 4, 5, 6, 7], [70])]
ADV = [1.5, -0.5, 0.0, -1.0, 0.7, -0.7]


def flat_grad(model, loss) -> torch.Tensor:
    """Every parameter's gradient, flattened in named_parameters order (the identity projection's layout)."""
    params = [p for _, p in model.named_parameters()]
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).double()


def sequence_logprob(model, prompt, response, behavior=None):
    """Per-token log pi (and ratio terms) of one unpadded sequence."""
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    return torch.stack([logp[len(prompt) + t - 1, tok] for t, tok in enumerate(response)])


def brute_response_grad(model, prompt, response, a, behavior=None):
    """grad of -(1/|y|) sum_t rho_t A for one response, autograd on its own sequence."""
    lp = sequence_logprob(model, prompt, response)
    old = lp.detach() if behavior is None else torch.tensor(behavior, dtype=torch.float64)
    return flat_grad(model, -(a * torch.exp(lp - old)).sum() / len(response))


def test_per_response_gradients_and_buffer_influence_match_brute_force(model_dir):
    model = load_causal_lm(model_dir, attn_implementation="sdpa")
    opts = OnlineFilterOptions(policy="iif", projection=IDENTITY, p=0.5)
    online = OnlineFilter(opts, model, pad_id=0, seed=0)
    got = online.engine.per_response(Responses.build(SEQS, 0), torch.tensor(ADV))

    brute = torch.stack([brute_response_grad(model, p, r, a) for (p, r), a in zip(SEQS, ADV)])
    assert got.shape == brute.shape
    assert torch.allclose(got.double(), brute, rtol=1e-4, atol=1e-6)
    assert torch.count_nonzero(got[2]) == 0  # advantage 0: exactly zero, never computed

    # IIF's target, from one autograd over the buffer's sequence-level objective (not from the rows above)
    objective = sum(a * sequence_logprob(model, p, r).sum() for (p, r), a in zip(SEQS, ADV)) / len(SEQS)
    target = flat_grad(model, -objective)
    for kind in ("dot", "cosine"):
        online.opts = opts.model_copy(update={"score": kind})
        result = online.select(SEQS, torch.tensor(ADV))
        expected = brute @ target
        if kind == "cosine":
            expected = torch.where(brute.norm(dim=1) > 0, expected / (brute.norm(dim=1) * target.norm()),
                                   torch.zeros_like(expected))
        assert torch.allclose(result.influence.double(), expected, rtol=1e-3, atol=1e-7), kind
        negative = [i for i in range(len(SEQS)) if expected[i] < 0]
        assert result.dropped == sorted(sorted(negative, key=lambda i: float(expected[i]))[:len(negative) // 2])
        assert result.keep == [i for i in range(len(SEQS)) if i not in result.dropped]


def test_validation_target_is_the_mean_popi_gradient(model_dir):
    """I-PPO's target off-policy (rho != 1): the mean over prompts of POPI's g(s), brute force per response."""
    model = load_causal_lm(model_dir, attn_implementation="sdpa")
    behavior_model = load_causal_lm(model_dir, attn_implementation="sdpa")
    with torch.no_grad():
        for p in behavior_model.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    engine = GradientEngine(model, IDENTITY)
    resp = Responses.build(SEQS, 0)
    behavior = GradientEngine(behavior_model, IDENTITY).token_logprobs(resp)
    from cropi.trainers.filters import _Validation

    val = _Validation("v", resp, torch.tensor(ADV), behavior, n_prompts=3)  # 3 prompts x 2 responses
    got = val.mean_gradient(engine)
    brute = sum(brute_response_grad(model, p, r, a, behavior[i, :len(r)].tolist())
                for i, ((p, r), a) in enumerate(zip(SEQS, ADV)))
    # POPI: g(s) = -(1/K) sum_k ..., then the mean over the 3 prompts
    assert torch.allclose(got.double(), brute / (2 * 3), rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------- the policies, on hand-made influences


INFLUENCE = torch.tensor([0.3, -0.2, 0.0, -1.5, 0.8, -0.05, -0.7, 2.0, -0.4, 0.1])
NEGATIVE = [1, 3, 5, 6, 8]  # ascending by value: 3 (-1.5), 6 (-0.7), 8 (-0.4), 1 (-0.2), 5 (-0.05)


def test_ippo_drops_every_negative_and_nothing_else():
    assert drop_set("ippo", INFLUENCE, 0.25, random.Random(0)) == NEGATIVE
    assert drop_set("none", INFLUENCE, 0.25, random.Random(0)) == []
    assert drop_set("ippo", torch.tensor([0.0, 1.0]), 0.25, random.Random(0)) == []  # zero is not negative


@pytest.mark.parametrize("p,expected", [(0.0625, []), (0.2, [3]), (0.25, [3]), (0.5, [3, 6]), (0.6, [3, 6, 8]),
                                        (1.0, NEGATIVE)])
def test_iif_drops_the_bottom_fraction_of_the_negatives(p, expected):
    assert drop_set("iif", INFLUENCE, p, random.Random(0)) == expected


def test_random_drops_a_seeded_set_of_the_iif_size():
    for p in (0.25, 0.5, 1.0):
        size = len(drop_set("iif", INFLUENCE, p, random.Random(0)))
        draws = [drop_set("random", INFLUENCE, p, random.Random(s)) for s in range(30)]
        assert all(len(d) == size and len(set(d)) == size and set(d) <= set(range(10)) for d in draws)
        assert drop_set("random", INFLUENCE, p, random.Random(4)) == draws[4]  # seeded
    chosen = {i for s in range(30) for i in drop_set("random", INFLUENCE, 1.0, random.Random(s))}
    assert chosen - set(NEGATIVE)  # random, not the negatives


def test_options_are_closed_and_the_validation_target_needs_files():
    with pytest.raises(TrainerOptionsError, match="validation_files"):
        make_trainer("lean", online_filter={"policy": "ippo"})
    with pytest.raises(TrainerOptionsError):
        make_trainer("lean", online_filter={"policy": "iif", "keep_all": True})
    with pytest.raises(TrainerOptionsError):
        make_trainer("lean", online_filter={"policy": "iif", "p": 0})
    assert OnlineFilterOptions(policy="iif").resolved_target == "buffer"
    assert OnlineFilterOptions(policy="ippo", validation_files={"v": "x"}).resolved_target == "validation"


# ---------------------------------------------------------------- inside the trainer


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("online-data")
    splits = make_splits(0, {"pool": 16, "val_count": 4})
    write_verl_parquet(splits["pool"], str(folder / "subset.parquet"))
    write_jsonl(splits["val_count"], str(folder / "val.jsonl"))
    return folder


BASE = dict(batch_prompts=4, rollouts=4, max_new_tokens=4, lr=1e-3, kl_coef=0.01)


def train(model_dir, data, out, steps=2, kl_coef=BASE["kl_coef"], **filter_opts):
    trainer = make_trainer("lean", **BASE | {"kl_coef": kl_coef}, online_filter=filter_opts)
    return trainer.train_stage(model=str(model_dir), subset=str(data / "subset.parquet"), out_dir=str(out),
                               steps=steps, seed=3, stage=0, reward=NOISY)


def rows_of(result):
    return [json.loads(line) for line in open(result.metrics_path) if '"eval"' not in line]


def test_a_filter_that_drops_nothing_gives_bitwise_the_same_update(model_dir, data, tmp_path):
    plain = train(model_dir, data, tmp_path / "plain")
    # iif with a p so small that floor(p * negatives) is 0: influences computed, nothing dropped
    kept = train(model_dir, data, tmp_path / "kept", policy="iif", p=0.001)
    rows = rows_of(kept)
    assert [r["filtered_fraction"] for r in rows] == [0.0, 0.0]
    assert not any("shared_update" in r for r in rows)  # a KL term: the update runs its own pass
    assert all(r["influence_mean"] != 0 and r["filter_s"] > 0 for r in rows)
    a, b = load_causal_lm(plain.checkpoint).state_dict(), load_causal_lm(kept.checkpoint).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and a filter that drops something changes it
    # (sjlt here: on this random tiny model the factored default scores every buffer response positive in
    # these two steps, so it would drop nothing)
    dropped = train(model_dir, data, tmp_path / "dropped", policy="iif", p=1.0,
                    projection={"kind": "sjlt", "dim": 2048, "kept_fraction": 0.1})
    assert any(r["filtered_fraction"] > 0 for r in rows_of(dropped))
    c = load_causal_lm(dropped.checkpoint).state_dict()
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_ippo_with_validation_rollouts_and_its_early_stop(model_dir, data, tmp_path):
    result = train(model_dir, data, tmp_path / "ippo", steps=4, policy="ippo",
                   validation_files={"count": str(data / "val.jsonl")}, validation_prompts=3,
                   validation_rollouts=4, early_stop_fraction=0.01)
    rows = rows_of(result)
    stopped = next(i for i, r in enumerate(rows) if r["filtered_fraction"] >= 0.01)
    assert len(rows) == stopped + 1 and rows[-1]["early_stop"] is True  # the stage ended at that step
    assert result.steps_done == stopped + 1 and result.metrics["early_stopped"] == 1.0
    assert "early stop" in open(result.log_path).read()
    assert all(0 <= r["filtered_fraction"] <= 1 and r["filter_s"] <= r["step_s"] for r in rows)


def test_demo_online_methods_map_to_valid_trainer_options():
    from cropi.demo.runner import curriculum_config
    from cropi.demo.settings import METHODS, DemoSettings

    assert set(DemoSettings().methods) == set(METHODS)  # the default comparison is unchanged
    settings = DemoSettings.make(quick=True, task="skills",
                                 methods=("cropi", "full", "ippo", "iif", "random_filter", "cropi+iif"))
    task = settings.load_task()
    data = {k: f"/data/{k}.jsonl" for k in ("pool", "val_count", "val_maxd", "test_count", "test_maxd")}
    expected = {"ippo": ("full", "ippo"), "iif": ("full", "iif"), "random_filter": ("full", "random"),
                "cropi+iif": ("cropi", "iif"), "full": ("full", "none"), "cropi": ("cropi", "none")}
    for method, (selection, policy) in expected.items():
        config = curriculum_config(settings, task, method, 1, "/model", data)
        trainer = make_trainer("lean", **config.trainer_options)
        assert (config.method, trainer.options.online_filter.policy) == (selection, policy), method
        assert config.name == f"{method.replace('+', '-')}-seed1"
    ippo = make_trainer("lean", **curriculum_config(settings, task, "ippo", 0, "/model", data).trainer_options)
    assert ippo.options.online_filter.validation_files == {"val_count": data["val_count"], "val_maxd": data["val_maxd"]}


# ---------------------------------------------------------------- the factored kind: one batched pass

FACTORED = ProjectionSpec(kind="factored", factor_in=4, factor_out=3, seed=2)


def named(flat: torch.Tensor, model) -> list[tuple[str, torch.Tensor]]:
    """Rows laid out as flat_grad's (every parameter in order) as (name, (n, *shape)) pairs."""
    shapes = [(n, p.shape) for n, p in model.named_parameters()]
    parts = torch.split(flat, [p.numel() for _, p in model.named_parameters()], dim=1)
    return [(n, part.reshape(flat.shape[0], *s)) for (n, s), part in zip(shapes, parts)]


def test_factored_rows_equal_projected_brute_force_and_the_kept_sets_equal_the_per_response_path(model_dir):
    model = load_causal_lm(model_dir, attn_implementation="sdpa")
    fast = GradientEngine(model, FACTORED, chunk=4)  # 4: the live rows go through two passes
    slow = GradientEngine(model, FACTORED, batched=False)  # vmap per response, then the projection
    assert fast.hooks is not None and slow.hooks is None
    resp, adv = Responses.build(SEQS, 0), torch.tensor(ADV)
    got = fast.per_response(resp, adv)
    brute = torch.stack([brute_response_grad(model, p, r, a) for (p, r), a in zip(SEQS, ADV)])
    want = fast.projector.project(named(brute, model))
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got, slow.per_response(resp, adv), rtol=1e-4, atol=1e-6)
    assert torch.count_nonzero(got[2]) == 0  # advantage 0: no row
    assert all(p.grad is None and p.requires_grad for p in model.parameters())  # the live policy untouched

    from cropi.trainers.filters import _Validation

    # a validation target against which some responses have negative influence
    target = _Validation("v", resp, torch.tensor([-0.3, 1.0, 0.5, 0.2, -1.2, 0.9]), fast.token_logprobs(resp), 3)
    for policy, p in (("iif", 0.5), ("iif", 1.0), ("ippo", 0.25)):
        opts = OnlineFilterOptions(policy=policy, p=p, target="validation", validation_files={"v": "unused"},
                                   projection=FACTORED)
        online = OnlineFilter(opts, model, pad_id=0, seed=0)
        online.validation = [target]
        batched = online.select(SEQS, adv)
        online.engine = slow
        reference = online.select(SEQS, adv)
        assert batched.dropped == reference.dropped and batched.keep == reference.keep, policy
        assert batched.dropped  # something was dropped: the comparison means something


def test_factored_validation_target_is_the_mean_popi_gradient(model_dir):
    model = load_causal_lm(model_dir, attn_implementation="sdpa")
    resp = Responses.build(SEQS, 0)
    behavior = GradientEngine(model, IDENTITY).token_logprobs(resp) - 0.1 * torch.arange(resp.mask.shape[1])
    from cropi.trainers.filters import _Validation

    val = _Validation("v", resp, torch.tensor(ADV), behavior, n_prompts=3)
    engine = GradientEngine(model, FACTORED)
    brute = sum(brute_response_grad(model, p, r, a, behavior[i, :len(r)].tolist())
                for i, ((p, r), a) in enumerate(zip(SEQS, ADV)))
    want = engine.projector.project(named(brute[None], model))[0] / (2 * 3)
    torch.testing.assert_close(val.mean_gradient(engine), want.float(), rtol=1e-4, atol=1e-7)


def test_without_kl_the_update_comes_from_the_filter_pass(model_dir, data, tmp_path):
    """kl_coef 0: the trainer's update is formed from the filter's pass; the same step with the update's own
    forward and backward (share_update false) scores, drops and trains alike (the gradients themselves
    against brute force: tests/test_shared_update.py)."""
    opts = dict(policy="ippo", validation_files={"count": str(data / "val.jsonl")}, validation_prompts=3,
                validation_rollouts=4)
    shared = train(model_dir, data, tmp_path / "shared", steps=1, kl_coef=0.0, **opts)
    own = train(model_dir, data, tmp_path / "own", steps=1, kl_coef=0.0, share_update=False, **opts)
    a, b = rows_of(shared), rows_of(own)
    assert a[0]["shared_update"] is True and "shared_update" not in b[0]
    assert a[0]["filtered_fraction"] == b[0]["filtered_fraction"] > 0
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-5) and a[0]["tokens"] == b[0]["tokens"]
    assert a[0]["grad_norm"] == pytest.approx(b[0]["grad_norm"], rel=1e-4)
    x, y = load_causal_lm(shared.checkpoint).state_dict(), load_causal_lm(own.checkpoint).state_dict()
    base = load_causal_lm(model_dir).state_dict()
    for k in x:
        # AdamW's first step is lr * g / (|g| + 1e-8): a coordinate whose gradient is float noise may move
        # either way, so: (almost) every coordinate the same, and the step moved the model
        off = (x[k] - y[k]).abs() > 1e-6
        assert int(off.sum()) <= max(2, off.numel() // 1000), k
    assert sum(int(((x[k] - base[k]).abs() > 1e-4).sum()) for k in x) > 10_000


def test_the_validation_target_is_re_scored_in_turn(model_dir):
    """validation_refresh 1: each select re-scores one validation prompt (prompt 0 of every set, then prompt
    1, ...) at the live parameters and keeps the others' terms; checked against the per-response path
    (vmap, then the projection) at the parameters of each term's last re-scoring."""
    from cropi.trainers.filters import _Validation

    model = load_causal_lm(model_dir, attn_implementation="sdpa")
    reference = GradientEngine(model, FACTORED, batched=False)
    resp = Responses.build(SEQS, 0)
    sets = [("a", torch.tensor([-0.3, 1.0, 0.5, 0.2, -1.2, 0.9])),
            ("b", torch.tensor([1.0, -1.0, 0.4, -0.4, 0.0, 0.0]))]  # b's last prompt: no signal
    opts = OnlineFilterOptions(policy="ippo", validation_files={"a": "-", "b": "-"}, projection=FACTORED)
    online = OnlineFilter(opts, model, pad_id=0, seed=0)
    online.validation = [_Validation(name, resp, adv, online.engine.token_logprobs(resp), 3) for name, adv in sets]

    def term(v, prompt):  # POPI's g(s) of one prompt, per response by vmap, at the live parameters
        rows = [2 * prompt, 2 * prompt + 1]
        sub = resp.take(torch.tensor(rows))
        return reference.per_response(sub, v.advantages[rows], v.behavior[rows][:, :sub.mask.shape[1]]).sum(0) / 2

    online.score_validation(None)  # the stage start: every term at theta_0
    expected = {(i, j): term(v, i) for j, v in enumerate(online.validation) for i in range(3)}
    generator = torch.Generator().manual_seed(5)
    for step, picked in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (0, 0)]):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=generator))
        result = online.select(SEQS[:4], torch.tensor(ADV[:4]))
        expected[picked] = term(online.validation[picked[1]], picked[0])  # (prompt, set) re-scored now
        for j, v in enumerate(online.validation):
            torch.testing.assert_close(v.table, torch.stack([expected[(i, j)] for i in range(3)]),
                                       rtol=1e-3, atol=1e-5)
        fresh = torch.stack([v.table.mean(0) for v in online.validation]).mean(0)
        torch.testing.assert_close(online.target(None, None), fresh)
        assert result.influence.shape == (4,)
    # the kept terms are stale, so the target is not the exact one at the last parameters
    exact = torch.stack([torch.stack([term(v, i) for i in range(3)]).mean(0) for v in online.validation]).mean(0)
    assert not torch.allclose(online.target(None, None), exact, rtol=1e-3, atol=1e-6)
