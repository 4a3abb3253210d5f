"""The POPI objective: off-policy GRPO loss for one prompt's group of responses.

    A_k       = (R_k - mean R) / (std R + 1e-4)             (std unbiased, as torch.std)
    rho_{k,t} = exp(log pi_theta(y_kt) - log beta(y_kt))
    L         = -(1/K) sum_k (1/|y_k|) sum_t rho_{k,t} A_k   (optionally PPO-clipped)

Pure tensor math, no model: the gradient computer feeds it micro-batches.
"""

from __future__ import annotations

import torch

ADV_EPS = 1e-4


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO group-normalised advantages. All-equal rewards give exactly zero."""
    rewards = rewards.to(torch.float64)
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    centered = rewards - rewards.mean()
    if torch.all(centered == 0):
        return torch.zeros_like(rewards)
    return centered / (rewards.std(unbiased=True) + ADV_EPS)


def popi_loss(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    n_group: int,
    clip_eps: float | None = None,
) -> torch.Tensor:
    """Loss contribution of a micro-batch of responses from one group of ``n_group``.

    ``logp``, ``behavior_logp``, ``mask``: (B, T) with ``mask`` 1 on response tokens.
    ``advantages``: (B,). Summing this over disjoint micro-batches of the group gives
    the full L, so their gradients accumulate to g(s).
    """
    return -popi_response_terms(logp, behavior_logp, mask, advantages, clip_eps).sum() / n_group


def popi_response_terms(logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor,
                        advantages: torch.Tensor, clip_eps: float | None = None) -> torch.Tensor:
    """Per response, (1/|y_k|) sum_t rho_{k,t} A_k (optionally PPO-clipped): (B,). L = -(1/K) sum_k of these."""
    mask = mask.to(logp.dtype)
    ratio = torch.exp((logp - behavior_logp) * mask)
    adv = advantages.to(logp.dtype)[:, None]
    per_token = ratio * adv
    if clip_eps is not None:
        clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
        per_token = torch.minimum(per_token, clipped)
    lengths = mask.sum(dim=1).clamp(min=1.0)
    return (per_token * mask).sum(dim=1) / lengths


def sequence_log_weights(logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per response, log w_k = sum_t (log pi_theta - log beta) over its response tokens: (B,), float64."""
    diff = (logp.to(torch.float64) - behavior_logp.to(torch.float64)) * mask.to(torch.float64)
    return diff.sum(dim=1)


def effective_sample_size(log_weights) -> float | None:
    """ESS = (sum w)^2 / sum w^2 of sequence weights given in log space; None for no responses.

    Computed as exp(2 logsumexp(lw) - logsumexp(2 lw)), so weights of exp(+-1000) neither
    overflow nor vanish. K when every weight is equal (theta = beta), 1 when one dominates.
    Non-finite log weights (a response the model cannot produce) give None.
    """
    lw = torch.as_tensor(log_weights, dtype=torch.float64).reshape(-1)
    if lw.numel() == 0 or not bool(torch.isfinite(lw).all()):
        return None
    return float(torch.exp(2 * torch.logsumexp(lw, 0) - torch.logsumexp(2 * lw, 0)))
