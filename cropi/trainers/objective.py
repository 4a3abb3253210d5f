"""The GRPO objective of the lean trainer, as plain tensor functions.

For a group of ``n`` responses to one prompt with rewards ``R_k``::

    A_k   = (R_k - mean_j R_j) / (std_j R_j + 1e-4)        std unbiased (n-1), as POPI's
    loss  = agg over response tokens of  -A_k * rho_kt  +  kl_coef * KL_kt
    rho   = exp(logp - logp_old)                         1 on-policy; its gradient is grad logp
    KL    = exp(ref - logp) - (ref - logp) - 1            the k3 estimator (verl's low_var_kl)

Aggregation: ``token-mean`` averages over every response token of the batch (verl's
default, DAPO's choice: long responses weigh more, none is diluted by its group);
``seq-mean-token-mean`` averages each response over its own tokens first (the GRPO
paper's form). One update per batch, so the ratio is 1 and no clip applies.
"""

from __future__ import annotations

from typing import Literal

import torch

from cropi.gradients import popi
from cropi.gradients.groups import picked_logprobs

Aggregation = Literal["token-mean", "seq-mean-token-mean"]


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Group-normalised advantages of rewards laid out group after group (prompt-major): POPI's own
    per-group definition (``cropi.gradients.popi.group_advantages``), so training and scoring agree."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    groups = rewards.reshape(-1, group_size)
    return torch.cat([popi.group_advantages(g) for g in groups]).to(torch.float32)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``log p(token_t | tokens_<t)`` for t = 1..L-1 of right-padded rows: shape [B, L-1]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    return picked_logprobs(logits, input_ids[:, 1:])


def grpo_loss(logp: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, *,
              ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
              aggregation: Aggregation = "token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """The loss over response tokens (``mask`` 1 there) and its parts for logging."""
    mask = mask.to(logp.dtype)
    per_token = -advantages[:, None] * torch.exp(logp - logp.detach())
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    loss = _aggregate(per_token, mask, aggregation)
    stats = {"kl": float(_aggregate(kl.detach(), mask, aggregation)),
             "tokens": float(mask.sum())}
    return loss, stats


def _aggregate(values: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    if aggregation == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if aggregation == "seq-mean-token-mean":
        return ((values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
    raise ValueError(f"unknown aggregation {aggregation!r}: use token-mean or seq-mean-token-mean")
