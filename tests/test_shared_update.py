"""The update formed from the online filter's own pass (cropi.trainers.shared_update.SharedUpdate) against an
independent brute force: every parameter's gradient, then the parameters after one AdamW step, against the
lean trainer's own two-pass update on the same kept responses."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from cropi.gradients.engine import GradientEngine, Responses
from cropi.models import build_tiny_model, load_causal_lm
from cropi.projection import ProjectionSpec
from cropi.trainers.filters import OnlineFilter, OnlineFilterOptions, _Validation
from cropi.trainers.lean import LeanOptions, _Run

FACTORED = ProjectionSpec(kind="factored", factor_in=4, factor_out=3, seed=2)
SEQS = [([5, 9, 11], [20, 21, 22, 23]), ([5, 9, 11], [30]), ([7, 8], [40, 41]), ([7, 8], [50, 51, 52]),
        ([3, 4, 5, 6, 7], [60, 61]), ([3, 4, 5, 6, 7], [70]), ([0, 2, 8], [9, 0, 1])]  # 0: the pad id as a token
ADV = [1.5, -0.5, 0.0, -1.0, 0.7, -0.7, 0.4]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("shared") / "base", seed=0).resolve()


# validation advantages against which, on this model, some buffer responses score negative and some positive
TARGETS = {"iif": [0.2, -0.2, 0.9, -0.9, -0.6, 0.6], "ippo": [0.5, 0.5, -1.0, 1.0, 0.3, -0.3]}


def filtered(model, aggregation, policy="iif"):
    """A filter with a validation target against which some responses score negative, and its select."""
    opts = OnlineFilterOptions(policy=policy, p=0.5, target="validation", validation_files={"v": "unused"},
                               projection=FACTORED)
    online = OnlineFilter(opts, model, pad_id=0, seed=0)
    resp = Responses.build(SEQS[:6], 0)
    online.validation = [_Validation("v", resp, torch.tensor(TARGETS[policy]),
                                     online.engine.token_logprobs(resp), 3)]
    online.score_validation(None)
    return online.select(SEQS, torch.tensor(ADV), aggregation=aggregation)


def brute_loss(model, seqs, adv, aggregation):
    """The lean trainer's no-KL GRPO loss, one unpadded sequence at a time, in float64."""
    terms = []
    for (prompt, response), a in zip(seqs, adv):
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + response])).logits[0].double(), -1)
        lp = torch.stack([logp[len(prompt) + t - 1, tok] for t, tok in enumerate(response)])
        terms.append(-a * torch.exp(lp - lp.detach()))
    if aggregation == "token-mean":
        return sum(t.sum() for t in terms) / sum(len(t) for t in terms)
    return sum(t.mean() for t in terms) / len(terms)


def test_tape_forms_any_row_weighted_gradient(model_dir):
    """The tape of one activation-only pass against float64 autograd of sum_r w_r L_r, L_r POPI's term."""
    model = load_causal_lm(model_dir, attn_implementation="sdpa")
    engine = GradientEngine(model, FACTORED)
    live = [i for i, a in enumerate(ADV) if a != 0]
    _, tape = engine.rows([SEQS[i] for i in live], torch.tensor(ADV)[live], tape=True)
    weights = torch.tensor([0.7, -1.3, 0.0, 2.0, 0.4, 1.1], dtype=torch.float64)  # one row weighs nothing
    got = tape.gradients(weights)
    params = dict(model.named_parameters())
    loss = 0
    for w, i in zip(weights.tolist(), live):
        (prompt, response), a = SEQS[i], ADV[i]
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + response])).logits[0].double(), -1)
        lp = torch.stack([logp[len(prompt) + t - 1, tok] for t, tok in enumerate(response)])
        loss = loss + w * -(a * torch.exp(lp - lp.detach())).mean()
    brute = torch.autograd.grad(loss, list(params.values()))
    for (name, p), b in zip(params.items(), brute):
        torch.testing.assert_close(got[p].double(), b.double(), rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_shared_gradient_is_the_kept_responses_update_gradient(model_dir, aggregation):
    model = load_causal_lm(model_dir, attn_implementation="sdpa")
    assert model.config.tie_word_embeddings and any(n.endswith(".bias") for n, _ in model.named_parameters())
    result = filtered(model, aggregation)
    # something dropped; kept: the zero-advantage response (it counts in N) and the one with the pad id as a token
    assert result.dropped and 2 in result.keep and 6 in result.keep
    assert result.update is not None and all(p.grad is None for p in model.parameters())

    kept = [SEQS[i] for i in result.keep]
    loss = brute_loss(model, kept, [ADV[i] for i in result.keep], aggregation)
    params = dict(model.named_parameters())
    brute = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    every_loss = brute_loss(model, SEQS, ADV, aggregation)
    everything = dict(zip(params, torch.autograd.grad(every_loss, list(params.values()))))
    assert set(result.update.grads) == set(params.values())  # every parameter: norms, biases, the tied embedding
    for name, p in params.items():
        torch.testing.assert_close(result.update.grads[p].double(), brute[name].double(), rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    # the comparison can fail: the gradient over every response is a different one
    assert any(not torch.allclose(brute[n], everything[n], rtol=1e-3, atol=1e-6) for n in params)
    assert result.update.loss == pytest.approx(loss.item(), rel=1e-5)
    assert result.update.tokens == sum(len(r) for _, r in kept)


def lean_run(model, lr=1e-3, aggregation="token-mean") -> _Run:
    """The lean trainer's step machinery around ``model`` (no rollout: the tests hand it the batch)."""
    run = _Run.__new__(_Run)
    run.opts = LeanOptions(lr=lr, aggregation=aggregation, kl_coef=0.0)
    run.policy, run.ref, run.sampler = model, None, SimpleNamespace(pad_id=0)
    # eps 1e-6, not 1e-8: Adam's first step is lr * g / (|g| + eps), so a coordinate whose gradient is float32
    # noise (|g| ~ 1e-8) would move by up to lr whichever path computed it; the gradients themselves are
    # compared tightly in the test above
    run.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-6,
                                      weight_decay=run.opts.weight_decay)
    return run


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_one_step_shared_equals_two_pass_and_brute_force(model_dir, aggregation):
    base = load_causal_lm(model_dir, attn_implementation="sdpa")
    shared_model, two_pass_model, brute_model = (copy.deepcopy(base) for _ in range(3))

    shared = lean_run(shared_model, aggregation=aggregation)
    result = filtered(shared_model, aggregation, policy="ippo")
    assert result.dropped and sum(ADV[i] != 0 for i in result.keep) >= 2
    stats = shared._apply(result.update)

    kept, adv = [SEQS[i] for i in result.keep], torch.tensor(ADV)[torch.tensor(result.keep)]
    two_pass = lean_run(two_pass_model, aggregation=aggregation)
    plain = two_pass._update(kept, adv)  # the trainer's own forward and backward on the kept responses

    brute = lean_run(brute_model, aggregation=aggregation)  # float64 autograd, the same clip and AdamW
    params = list(brute_model.parameters())
    grads = torch.autograd.grad(brute_loss(brute_model, kept, adv.tolist(), aggregation), params)
    for p, g in zip(params, grads):
        p.grad = g.to(p.dtype)
    norm = torch.nn.utils.clip_grad_norm_(params, brute.opts.grad_clip)
    brute.optimizer.step()

    assert stats["loss"] == pytest.approx(plain["loss"], rel=1e-5) and stats["tokens"] == plain["tokens"]
    assert stats["grad_norm"] == pytest.approx(float(norm), rel=1e-4) == plain["grad_norm"]
    moved = 0
    for (name, a), b, c, d in zip(shared_model.named_parameters(), two_pass_model.parameters(),
                                  brute_model.parameters(), base.parameters()):
        # AdamW's first step moves a coordinate by about lr * g / (|g| + eps): a tolerance of 1% of lr catches
        # any coordinate whose gradient differs in sign, or is wrongly near zero
        torch.testing.assert_close(a, c, rtol=0, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(b, c, rtol=0, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
        moved += int((a - d).abs().gt(5e-4).sum())
    assert moved > 10_000  # the step moved the model: the comparison means something
