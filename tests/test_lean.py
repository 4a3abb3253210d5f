"""The lean GRPO trainer: its objective against an independent brute force, and stages that continue a run."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from cropi.data import write_jsonl, write_verl_parquet
from cropi.pipeline.curriculum.state import stage_cost
from cropi.models import build_tiny_model, load_causal_lm
from cropi.rewards import register_reward
from cropi.tasks.skills import make_splits
from cropi.trainers import make_trainer, read_marker
from cropi.trainers.objective import group_advantages, grpo_loss, token_logprobs
from cropi.trainers.lean import _right_pad

DIGITS = "test_lean_digits"


@register_reward(DIGITS, replace=True)
def _digit_share(text: str, answer: str) -> float:
    # dense, so a random tiny model's groups have reward variance
    return sum(c.isdigit() for c in text) / max(len(text), 1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("lean") / "base", seed=0).resolve()


# ---------------------------------------------------------------- the objective, brute force


def brute_advantages(rewards: list[float], n: int) -> list[float]:
    out = []
    for g in range(0, len(rewards), n):
        group = rewards[g:g + n]
        mean, std = statistics.fmean(group), statistics.stdev(group)  # n-1, as torch.std
        out += [(r - mean) / (std + 1e-4) for r in group]
    return out


def test_group_advantages_match_brute_force():
    rewards = [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1]
    got = group_advantages(torch.tensor(rewards, dtype=torch.float32), 4).tolist()
    assert got == pytest.approx(brute_advantages(rewards, 4), abs=1e-6)
    assert got[4:8] == [0.0, 0.0, 0.0, 0.0]  # all-equal group: no signal, not a division by ~0
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(10), 4)


def brute_loss(model, ref, seqs, adv, kl_coef, aggregation):
    """The GRPO loss summed one token at a time, each sequence on its own (no padding, no batching)."""
    terms = []
    for (prompt, response), a in zip(seqs, adv):
        ids = torch.tensor([prompt + response])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        ref_logp = torch.log_softmax(ref(input_ids=ids).logits[0].double(), -1) if ref is not None else None
        seq = []
        for t, tok in enumerate(response):
            pos = len(prompt) + t - 1  # the logits that predict response token t
            lp = logp[pos, tok]
            term = -a * torch.exp(lp - lp.detach())
            if ref is not None:
                d = ref_logp[pos, tok].detach() - lp
                term = term + kl_coef * (torch.exp(d) - d - 1)
            seq.append(term)
        terms.append(seq)
    if aggregation == "token-mean":
        return sum(sum(s) for s in terms) / sum(len(s) for s in terms)
    return sum(sum(s) / len(s) for s in terms) / len(terms)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_grpo_loss_and_gradient_match_brute_force(model_dir, aggregation):
    torch.manual_seed(0)
    model = load_causal_lm(model_dir, attn_implementation="eager")
    ref = load_causal_lm(model_dir, attn_implementation="eager")
    with torch.no_grad():  # move the policy off the reference so the KL term is not zero
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    # different prompt and response lengths, an EOS-length response of 1 token
    seqs = [([5, 9, 11], [20, 21, 22, 23]), ([7, 8], [30]), ([3, 4, 5, 6, 7], [40, 41]),
            ([12, 13, 14], [50, 51, 52])]
    adv = [1.5, -0.5, 0.0, -1.0]

    ids, attn, mask = _right_pad(seqs, pad_id=0, device="cpu")
    logp = token_logprobs(model, ids, attn)
    with torch.no_grad():
        ref_logp = token_logprobs(ref, ids, attn)
    loss, stats = grpo_loss(logp, mask, torch.tensor(adv), ref_logp=ref_logp, kl_coef=0.1, aggregation=aggregation)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    expected = brute_loss(model, ref, seqs, adv, 0.1, aggregation)
    expected.backward()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5, abs=1e-6)
    assert stats["tokens"] == sum(len(r) for _, r in seqs)  # every response token, none of the prompt
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad.float(), rtol=1e-4, atol=1e-6), n


def test_kl_is_zero_at_the_reference_and_skipped_without_a_coefficient(model_dir):
    model = load_causal_lm(model_dir)
    ids, attn, mask = _right_pad([([1, 2, 3], [4, 5])], pad_id=0, device="cpu")
    logp = token_logprobs(model, ids, attn)
    _, stats = grpo_loss(logp, mask, torch.tensor([1.0]), ref_logp=logp.detach(), kl_coef=0.5)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-7)
    plain, _ = grpo_loss(logp, mask, torch.tensor([1.0]))
    shifted, _ = grpo_loss(logp, mask, torch.tensor([1.0]), ref_logp=logp.detach() + 1.0, kl_coef=0.0)
    assert float(plain) == float(shifted)


def test_right_pad_marks_exactly_the_response_targets():
    ids, attn, mask = _right_pad([([1, 2], [3, 4, 5]), ([6], [7])], pad_id=0, device="cpu")
    assert ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # position t scores token t+1: row 0's targets are tokens 3, 4, 5 at positions 1..3
    assert mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]


# ---------------------------------------------------------------- the trainer across stages


def test_two_stages_continue_one_run_with_evaluation(model_dir, tmp_path):
    splits = make_splits(0, {"pool": 24, "test_count": 6})
    subset, test = tmp_path / "subset.parquet", tmp_path / "test.jsonl"
    write_verl_parquet(splits["pool"], str(subset))
    write_jsonl(splits["test_count"], str(test))
    trainer = make_trainer("lean", batch_prompts=4, rollouts=4, max_new_tokens=6, lr=1e-3, kl_coef=0.01,
                           eval_files={"test": str(test)}, eval_every=2, eval_samples=2)
    first = trainer.train_stage(model=str(model_dir), subset=str(subset), out_dir=str(tmp_path / "s0"), steps=3,
                                seed=0, stage=0, reward=DIGITS)
    second = trainer.train_stage(model=first.checkpoint, subset=str(subset), out_dir=str(tmp_path / "s1"),
                                 steps=2, seed=1, stage=1, reward=DIGITS)
    assert (first.global_step, second.global_step, second.steps_done) == (3, 5, 2)
    assert read_marker(second.checkpoint).reference_model == str(model_dir)  # KL stays against the initial model
    rows = [json.loads(line) for line in open(first.metrics_path)] + \
           [json.loads(line) for line in open(second.metrics_path)]
    evals = [r["step"] for r in rows if "eval" in r]
    assert evals == [0, 2, 3, 4, 5]  # step 0 once, every 2 global steps, and each stage's end
    assert all(math.isfinite(r["loss"]) for r in rows if "eval" not in r)
    # the test-split evaluations are reported apart, and a stage's cost leaves them out of its training
    first_evals = [json.loads(line)["eval_s"] for line in open(first.metrics_path) if '"eval"' in line]
    assert first.metrics["eval_s"] == pytest.approx(sum(first_evals), abs=1e-3) and first.metrics["eval_s"] > 0
    cost = stage_cost({"scored": {"seconds": 1.5}, "trained": {"metrics": first.metrics}})
    assert cost["evaluation"] == first.metrics["eval_s"]
    assert cost["training"] == pytest.approx(first.metrics["runtime_s"] - first.metrics["eval_s"], abs=1e-3)
    assert 0 < cost["training"] < first.metrics["runtime_s"] and cost["scoring"] == 1.5
    before, after = load_causal_lm(model_dir).state_dict(), load_causal_lm(second.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (tmp_path / "s0" / "trainer_state" / "optimizer.pt").is_file()


def test_same_seed_same_stage_is_reproducible(model_dir, tmp_path):
    splits = make_splits(0, {"pool": 12})
    subset = tmp_path / "subset.parquet"
    write_verl_parquet(splits["pool"], str(subset))
    trainer = make_trainer("lean", batch_prompts=4, rollouts=4, max_new_tokens=4, lr=1e-3, kl_coef=0.0)
    a, b = (trainer.train_stage(model=str(model_dir), subset=str(subset), out_dir=str(tmp_path / d), steps=2,
                                seed=7, stage=0, reward=DIGITS) for d in ("a", "b"))
    wa, wb = load_causal_lm(a.checkpoint).state_dict(), load_causal_lm(b.checkpoint).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_prompt_order_covers_each_epoch_and_never_repeats_within_a_batch():
    from cropi.trainers.lean import _PromptOrder

    order = _PromptOrder(10, seed=3)
    batches = [order.take(4) for _ in range(25)]  # 100 draws: 10 epochs, batches crossing epoch ends
    assert all(len(set(b)) == 4 for b in batches)
    flat = [i for b in batches for i in b]
    counts = {i: flat.count(i) for i in range(10)}
    assert set(counts.values()) == {10}  # every prompt exactly once an epoch over the run
