"""Per-prompt POPI gradient at a checkpoint, projected.

One backward pass per prompt (its K responses, micro-batched under a token
budget with gradient accumulation), then the projector maps the parameter
gradients to a k-vector. The computer owns ``requires_grad`` on the model: only
the parameters the projection spec covers get gradients, which saves work.

``make_computer`` picks the computer a spec needs: this one, or for the batched kinds
(``factored``, ``tensorsketch``) the batched one (``cropi.gradients.batched``), which gets many
prompts' vectors from one backward. Both have ``compute`` (one prompt) and
``compute_many`` (a list; ``prompts_per_call`` at a time is what callers feed).

A group whose rewards are all equal (status ``zero_advantage``) has a gradient of exactly zero at
every theta, under either estimator: neither computer runs the model on it. Its ``p_theta`` (the
common reward) and ``std_theta`` (0) need no weights; its ``ess``, ``ess_fraction`` and
``log_mean_weight`` are absent (None). The theta estimator's other zero-advantage groups (mixed
rewards a fresh group at theta would likely not show) keep every diagnostic: their forward ran.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from cropi.gradients.options import LossOptions
from cropi.gradients.batching import build_micro_batch, plan_micro_batches
from cropi.gradients.popi import (group_advantages, popi_loss, sequence_log_weights, theta_coefficients,
                                  theta_loss)
from cropi.gradients.groups import (Trajectories, all_equal, context_limit, diagnostics, fit_to_context,  # noqa: F401
                                    pad_id_of, rewards_and_base, token_logprobs, unweighted_diagnostics)
from cropi.store.types import GradientRecord


class GradientComputer:
    prompts_per_call = 1  # nothing is shared between prompts: callers may feed them one by one

    def __init__(self, model: torch.nn.Module, projector, options: LossOptions | None = None):
        self.model = model
        self.projector = projector
        self.options = options or LossOptions()
        covered = set(projector.param_names)
        self.params = [(n, p) for n, p in model.named_parameters() if n in covered]
        missing = covered - {n for n, _ in self.params}
        if missing:
            raise ValueError(f"projector covers parameters the model lacks: {sorted(missing)[:5]}")
        for name, p in model.named_parameters():
            p.requires_grad_(name in covered)
        self.device = next(model.parameters()).device
        self.pad_id = pad_id_of(model)
        self.max_length = context_limit(model, self.options)

    def compute_many(self, trajs: Sequence[Trajectories]) -> list[GradientRecord]:
        return [self.compute(t) for t in trajs]

    def compute(self, traj: Trajectories) -> GradientRecord:
        prompt, responses, behavior, truncated = fit_to_context(traj, self.max_length)
        rewards, base = rewards_and_base(traj, prompt, responses)
        if truncated == "prompt":
            return GradientRecord(vector=self._zeros(), raw_norm=0.0, status="truncated", **base)
        if all_equal(rewards):
            # No gradient at any theta, so no forward either: p_theta and std_theta need no weights, the ESS is absent.
            return GradientRecord(vector=self._zeros(), raw_norm=0.0, status="zero_advantage",
                                  **base, **unweighted_diagnostics(rewards))
        adv, log_w = self._advantages(prompt, responses, behavior, rewards)
        if not torch.any(adv != 0):
            # The theta estimator gives no signal at theta: the weights its forward pass gave are the diagnostics'.
            return GradientRecord(vector=self._zeros(), raw_norm=0.0, status="zero_advantage",
                                  **base, **self._diagnostics(log_w, rewards))
        base |= self._diagnostics(self._backward(prompt, responses, behavior, adv), rewards)
        grads = [(n, _grad_of(p)[None]) for n, p in self.params]
        raw_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for _, g in grads))
        if not math.isfinite(raw_norm):
            return GradientRecord(vector=self._zeros(), raw_norm=raw_norm, status="nonfinite", **base)
        vector = self.projector.project(grads)[0].float().cpu().numpy()
        status = "truncated" if truncated else "ok"
        return GradientRecord(vector=vector, raw_norm=raw_norm, status=status, **base)

    def _advantages(self, prompt, responses, behavior, rewards: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-response advantages ``_loss`` takes, for a group whose rewards are not all equal: the
        behavior group's (CROPI), or the theta estimator's coefficients, whose weights need a forward
        pass at theta first (returned with them; None for CROPI's, which need none)."""
        if self.options.advantage == "behavior":
            return group_advantages(rewards), None
        with torch.no_grad():
            log_w = self._backward(prompt, responses, behavior, None)
        return theta_coefficients(rewards, log_w), log_w

    def _backward(self, prompt, responses, behavior, adv: torch.Tensor | None) -> torch.Tensor:
        """One pass over the group: backward of the POPI loss when ``adv`` is given (the
        gradients land in ``p.grad``); returns every response's sequence log-weight."""
        for _, p in self.params:
            p.grad = None
        log_w = torch.zeros(len(responses), dtype=torch.float64)
        lengths = [len(prompt) + len(r) for r in responses]
        for indices in plan_micro_batches(lengths, self.options.token_budget):
            mb = build_micro_batch(prompt, responses, behavior, indices, self.pad_id)
            logp = token_logprobs(self.model, mb, self.device)
            beh, mask = mb.behavior_logp.to(self.device), mb.response_mask.to(self.device)
            log_w[indices] = sequence_log_weights(logp.detach(), beh, mask).cpu()
            if adv is not None:
                self._loss(logp, beh, mask, adv[indices].to(self.device), len(responses)).backward()
        return log_w

    def _loss(self, logp, behavior_logp, mask, adv, n_group: int) -> torch.Tensor:
        """The micro-batch's share of the group's loss: POPI's, or the theta estimator's (its
        ``adv`` are ``theta_coefficients``); an estimator variant overrides this."""
        if self.options.advantage == "theta":
            return theta_loss(logp, mask, adv, n_group=n_group)
        return popi_loss(logp, behavior_logp, mask, adv, n_group=n_group, clip_eps=self.options.clip_eps)

    @staticmethod
    def _diagnostics(log_w: torch.Tensor, rewards: torch.Tensor) -> dict:
        return diagnostics(log_w, rewards)

    def _zeros(self) -> np.ndarray:
        return np.zeros(self.projector.out_dim, dtype=np.float32)


def make_computer(model: torch.nn.Module, projector, options: LossOptions | None = None):
    """The gradient computer for ``projector``'s kind: batched for ``factored`` and ``tensorsketch``
    (cropi.projection.spec.BATCHED_KINDS), per prompt otherwise."""
    from cropi.projection.spec import is_batched

    if is_batched(projector.spec):
        from cropi.gradients.batched import BatchedComputer

        return BatchedComputer(model, projector, options)
    return GradientComputer(model, projector, options)


def _grad_of(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)

