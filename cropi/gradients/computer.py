"""Per-prompt POPI gradient at a checkpoint, projected.

One backward pass per prompt (its K responses, micro-batched under a token
budget with gradient accumulation), then the projector maps the parameter
gradients to a k-vector. The computer owns ``requires_grad`` on the model: only
the parameters the projection spec covers get gradients, which saves work.
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import numpy as np
import torch

from cropi.gradients.options import LossOptions
from cropi.gradients.batching import build_micro_batch, plan_micro_batches
from cropi.gradients.popi import effective_sample_size, group_advantages, popi_loss, sequence_log_weights
from cropi.store.types import GradientRecord


class Trajectories(Protocol):
    """What the computer needs of one prompt's offline trajectories."""

    prompt_id: str
    prompt_token_ids: Sequence[int]
    responses: Sequence[Sequence[int]]
    behavior_logprobs: Sequence[Sequence[float]]
    rewards: Sequence[float | None]


class GradientComputer:
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
        self.pad_id = _pad_id(model)
        self.max_length = self.options.max_length or getattr(model.config, "max_position_embeddings", None)

    def compute(self, traj: Trajectories) -> GradientRecord:
        prompt, responses, behavior, truncated = self._fit(traj)
        rewards = torch.tensor([0.0 if r is None else float(r) for r in traj.rewards])
        n_tokens = sum(len(prompt) + len(r) for r in responses)
        base = dict(prompt_id=traj.prompt_id, n_responses=len(responses), n_tokens=n_tokens,
                    reward_mean=float(rewards.mean()) if len(rewards) else 0.0,
                    reward_std=float(rewards.std()) if len(rewards) > 1 else 0.0)
        adv = group_advantages(rewards)
        if truncated == "prompt":
            return GradientRecord(vector=self._zeros(), raw_norm=0.0, status="truncated", **base)
        if not torch.any(adv != 0):
            # No gradient, but the ESS still says whether theta has moved away from these samples.
            with torch.no_grad():
                base |= self._ess(self._backward(prompt, responses, behavior, None), len(responses))
            return GradientRecord(vector=self._zeros(), raw_norm=0.0, status="zero_advantage", **base)
        base |= self._ess(self._backward(prompt, responses, behavior, adv), len(responses))
        grads = [(n, _grad_of(p)[None]) for n, p in self.params]
        raw_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for _, g in grads))
        if not math.isfinite(raw_norm):
            return GradientRecord(vector=self._zeros(), raw_norm=raw_norm, status="nonfinite", **base)
        vector = self.projector.project(grads)[0].float().cpu().numpy()
        status = "truncated" if truncated else "ok"
        return GradientRecord(vector=vector, raw_norm=raw_norm, status=status, **base)

    def _backward(self, prompt, responses, behavior, adv: torch.Tensor | None) -> torch.Tensor:
        """One pass over the group: backward of the POPI loss when ``adv`` is given (the
        gradients land in ``p.grad``); returns every response's sequence log-weight."""
        for _, p in self.params:
            p.grad = None
        log_w = torch.zeros(len(responses), dtype=torch.float64)
        lengths = [len(prompt) + len(r) for r in responses]
        for indices in plan_micro_batches(lengths, self.options.token_budget):
            mb = build_micro_batch(prompt, responses, behavior, indices, self.pad_id)
            logp = self._token_logprobs(mb)
            beh, mask = mb.behavior_logp.to(self.device), mb.response_mask.to(self.device)
            log_w[indices] = sequence_log_weights(logp.detach(), beh, mask).cpu()
            if adv is not None:
                self._loss(logp, beh, mask, adv[indices].to(self.device), len(responses)).backward()
        return log_w

    def _loss(self, logp, behavior_logp, mask, adv, n_group: int) -> torch.Tensor:
        """The micro-batch's share of the group's loss: POPI's (an estimator variant overrides this)."""
        return popi_loss(logp, behavior_logp, mask, adv, n_group=n_group, clip_eps=self.options.clip_eps)

    @staticmethod
    def _ess(log_w: torch.Tensor, k: int) -> dict:
        ess = effective_sample_size(log_w)
        return {"ess": ess, "ess_fraction": None if ess is None or k == 0 else ess / k}

    def _token_logprobs(self, mb) -> torch.Tensor:
        keep = mb.targets.shape[1] + 1
        out = self.model(input_ids=mb.input_ids.to(self.device),
                         attention_mask=mb.attention_mask.to(self.device),
                         position_ids=mb.position_ids.to(self.device),
                         logits_to_keep=keep, use_cache=False)
        logits = out.logits[:, :-1].float()
        targets = mb.targets.to(self.device)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)

    def _fit(self, traj: Trajectories):
        """Cut responses that overflow the context; flag what was cut."""
        prompt = list(traj.prompt_token_ids)
        responses = [list(r) for r in traj.responses]
        behavior = [list(b) for b in traj.behavior_logprobs]
        limit = self.max_length
        if limit is None:
            return prompt, responses, behavior, None
        if len(prompt) >= limit:
            return prompt, responses, behavior, "prompt"
        room = limit - len(prompt)
        cut = any(len(r) > room for r in responses)
        return prompt, [r[:room] for r in responses], [b[:room] for b in behavior], ("response" if cut else None)

    def _zeros(self) -> np.ndarray:
        return np.zeros(self.projector.out_dim, dtype=np.float32)


def _grad_of(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _pad_id(model) -> int:
    cfg = model.config
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(cfg, attr, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0
