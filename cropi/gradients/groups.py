"""What both gradient paths (per prompt, and batched factored) do with one prompt's group: fit it to
the context, its rewards and record fields, per-token log-probs at theta, and the off-policy
diagnostics of its importance weights (ESS, p_theta, std_theta, log mean weight), or, for a group
whose rewards are all equal (no gradient, no forward), the ones that need no weights."""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from cropi.gradients.options import LossOptions
from cropi.gradients.popi import effective_sample_size, group_advantages, log_mean_weight, weighted_group_stats


class Trajectories(Protocol):
    """What the computer needs of one prompt's offline trajectories."""

    prompt_id: str
    prompt_token_ids: Sequence[int]
    responses: Sequence[Sequence[int]]
    behavior_logprobs: Sequence[Sequence[float]]
    rewards: Sequence[float | None]


def token_logprobs(model, mb, device) -> torch.Tensor:
    """log pi of each target token of a left-padded micro-batch (B, L); logits only where needed."""
    keep = mb.targets.shape[1] + 1
    out = model(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device),
                position_ids=mb.position_ids.to(device), logits_to_keep=keep, use_cache=False)
    logits = out.logits[:, :-1]
    targets = mb.targets.to(device)
    return picked_logprobs(logits, targets)


def vocab_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)`` over the vocabulary in float32 (float64 for float64 checks), from logits in the
    model's dtype. The softmax reads half-precision logits and writes float32 itself (``dtype=``), and its
    backward writes the gradient back in the logits' dtype: no float32 copy of the vocabulary-wide logits,
    nor of their gradient. (It did not lower the scoring path's measured peak on an H200, which the
    activations set: docs/batched_scoring.md.) For float32 logits these are a cast-first's operations:
    the same bits (checked on CPU)."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))


def picked_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``vocab_logprobs(logits)`` at ``targets`` (the same leading shape)."""
    return vocab_logprobs(logits).gather(-1, targets[..., None]).squeeze(-1)


def fit_to_context(traj: Trajectories, limit: int | None):
    """Cut responses that overflow the context; flag what was cut ("prompt", "response" or None)."""
    prompt = list(traj.prompt_token_ids)
    responses = [list(r) for r in traj.responses]
    behavior = [list(b) for b in traj.behavior_logprobs]
    if limit is None:
        return prompt, responses, behavior, None
    if len(prompt) >= limit:
        return prompt, responses, behavior, "prompt"
    room = limit - len(prompt)
    cut = any(len(r) > room for r in responses)
    return prompt, [r[:room] for r in responses], [b[:room] for b in behavior], ("response" if cut else None)


def rewards_and_base(traj: Trajectories, prompt, responses) -> tuple[torch.Tensor, dict]:
    """The group's rewards (a failed reward counts 0) and the record fields every status shares."""
    rewards = torch.tensor([0.0 if r is None else float(r) for r in traj.rewards])
    n_tokens = sum(len(prompt) + len(r) for r in responses)
    base = dict(prompt_id=traj.prompt_id, n_responses=len(responses), n_tokens=n_tokens,
                reward_mean=float(rewards.mean()) if len(rewards) else 0.0,
                reward_std=float(rewards.std()) if len(rewards) > 1 else 0.0)
    return rewards, base


def diagnostics(log_w: torch.Tensor, rewards: torch.Tensor) -> dict:
    """ESS, ESS/K, the importance-weighted pass rate and std of the group at theta, and the log
    of the mean weight."""
    k = len(log_w)
    ess = effective_sample_size(log_w)
    stats = weighted_group_stats(log_w, rewards) if k else None
    return {"ess": ess, "ess_fraction": None if ess is None or k == 0 else ess / k,
            "p_theta": None if stats is None else stats[0], "std_theta": None if stats is None else stats[1],
            "log_mean_weight": log_mean_weight(log_w)}


def all_equal(rewards: torch.Tensor) -> bool:
    """Whether the group carries no signal whatever theta is: its rewards are all equal (or it has
    fewer than two), exactly when POPI's advantages (``group_advantages``) are all zero, and the theta
    estimator's too (``theta_coefficients``). Neither computer runs the model on such a group."""
    return not bool(torch.any(group_advantages(rewards) != 0))


def unweighted_diagnostics(rewards: torch.Tensor) -> dict:
    """``diagnostics`` of a group whose rewards are all equal, without a forward pass: p_theta is
    the common reward and std_theta 0 whatever the weights (self-normalised weights sum to 1);
    ESS, ESS/K and the log mean weight need the weights and are absent (None, stored as null)."""
    k = len(rewards)
    return {"ess": None, "ess_fraction": None, "p_theta": float(rewards[0]) if k else None,
            "std_theta": 0.0 if k else None, "log_mean_weight": None}


def context_limit(model, options: LossOptions) -> int | None:
    return options.max_length or getattr(model.config, "max_position_embeddings", None)


def pad_id_of(model) -> int:
    cfg = model.config
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(cfg, attr, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0
