"""The POPI objective: off-policy GRPO loss for one prompt's group of responses.

    A_k       = (R_k - mean R) / (std R + 1e-4)             (std unbiased, as torch.std)
    rho_{k,t} = exp(log pi_theta(y_kt) - log beta(y_kt))
    L         = -(1/K) sum_k (1/|y_k|) sum_t rho_{k,t} A_k   (optionally PPO-clipped)

Pure tensor math, no model: the gradient computer feeds it micro-batches.

The "theta" estimator (``theta_coefficients``, ``theta_loss``) centres and scales the
advantages by the current policy's importance-weighted pass rate and spread instead of
the behavior group's (METHOD.md, importance-weighted group statistics):

    wbar_k = w_k / sum_j w_j                                 (sequence weights, self-normalised)
    A_k    = (R_k - p_theta) / (std_theta + 1e-4)
    L      = -(1/K) sum_k (K wbar_k A_k) (1/|y_k|) sum_t log pi_theta(y_kt)   (wbar_k A_k constants)

and, as POPI's advantages are zero when the group's rewards are all equal, its advantages are
zero when a fresh group of K at theta would more likely than not have all-equal rewards:
mixed_probability(p_theta, K) = 1 - p^K - (1-p)^K < 1/2. A mixed group sampled at theta itself
(w all equal) has p in [1/K, 1 - 1/K], where that probability is >= 1/2: at theta = beta the
estimator is POPI's up to the std convention (biased here, unbiased there).
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


def weighted_group_stats(log_weights, rewards) -> tuple[float, float] | None:
    """(p_theta, std_theta): the self-normalised importance-weighted mean of the rewards and the
    matching (biased) standard deviation, sqrt(sum w (R - p)^2 / sum w), with the sequence weights
    given in log space. The normalised weights are exp(lw - logsumexp(lw)), so log weights of
    +-1000 neither overflow nor vanish. None for no responses or a non-finite log weight.
    """
    wbar = normalised_weights(log_weights)
    if wbar is None:
        return None
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if r.shape != wbar.shape:
        raise ValueError(f"{wbar.numel()} log weights but {r.numel()} rewards")
    p = (wbar * r).sum()
    var = (wbar * (r - p) ** 2).sum()
    return float(p), float(var.clamp(min=0.0).sqrt())


def log_mean_weight(log_weights) -> float | None:
    """log((1/K) sum_k w_k), from log weights (logsumexp, overflow-safe): the ordinary importance-
    sampling estimate of the probability theta gives the responses beta's sample stands for; 0 at
    theta = beta. Unlike p_theta it moves for a group whose rewards are all equal (theta taking mass
    off failures it no longer makes). None for no responses or a non-finite log weight."""
    lw = torch.as_tensor(log_weights, dtype=torch.float64).reshape(-1)
    if lw.numel() == 0 or not bool(torch.isfinite(lw).all()):
        return None
    return float(torch.logsumexp(lw, 0) - torch.log(torch.tensor(float(lw.numel()), dtype=torch.float64)))


def normalised_weights(log_weights) -> torch.Tensor | None:
    """w_k / sum_j w_j from log weights (float64, sums to 1); None when empty or non-finite."""
    lw = torch.as_tensor(log_weights, dtype=torch.float64).reshape(-1)
    if lw.numel() == 0 or not bool(torch.isfinite(lw).all()):
        return None
    return torch.softmax(lw, 0)


def mixed_probability(p: float, k: int) -> float:
    """Probability that k Bernoulli(p) rewards are not all equal: 1 - p^k - (1-p)^k (p clipped to [0, 1])."""
    p = min(max(p, 0.0), 1.0)
    return 1.0 - p ** k - (1.0 - p) ** k


def theta_coefficients(rewards: torch.Tensor, log_weights) -> torch.Tensor:
    """Per response K wbar_k (R_k - p_theta) / (std_theta + 1e-4): the theta estimator's
    advantage times its normalised weight (K wbar_k = 1 at theta = beta). Exactly zero when
    every reward is equal or when a fresh group of K at theta would more likely than not be
    all-equal (``mixed_probability`` < 1/2): no signal at theta. NaN when a weight is undefined
    (the gradient is then reported non-finite, as POPI's would be)."""
    r = rewards.to(torch.float64).reshape(-1)
    if r.numel() < 2 or bool(torch.all(r == r[0])):
        return torch.zeros_like(r)
    wbar = normalised_weights(log_weights)
    if wbar is None:
        return torch.full_like(r, float("nan"))
    p = (wbar * r).sum()
    if mixed_probability(float(p), r.numel()) < 0.5:
        return torch.zeros_like(r)
    std = (wbar * (r - p) ** 2).sum().clamp(min=0.0).sqrt()
    return r.numel() * wbar * (r - p) / (std + ADV_EPS)


def theta_loss(logp: torch.Tensor, mask: torch.Tensor, coefficients: torch.Tensor, n_group: int) -> torch.Tensor:
    """Micro-batch share of the theta estimator's loss: -(1/K) sum_k c_k (1/|y_k|) sum_t log pi(y_kt),
    ``coefficients`` c_k from ``theta_coefficients`` (constants: no gradient through the weights)."""
    mask = mask.to(logp.dtype)
    lengths = mask.sum(dim=1).clamp(min=1.0)
    per_response = (logp * mask).sum(dim=1) / lengths
    return -(coefficients.to(logp.dtype) * per_response).sum() / n_group


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
