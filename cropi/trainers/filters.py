"""Online influence filtering inside a GRPO step: I-PPO and IIF on the POPI gradient engine.

Between rollout and update, every response ``z = (x, y)`` of the step's buffer gets an
influence score at the step's starting parameters ``theta_k`` (docs/online_filtering.md)::

    g(z)  = grad [ -(1/|y|) sum_t rho_t A(z) ]                  rho = 1 on-policy (POPI's per-response loss)
    t     = validation: mean over the validation sets of their mean POPI gradient   (I-PPO)
            buffer:     grad [ -mean_{z in B} log pi(y|x) A(z) ] = mean_z |y_z| g(z)  (IIF: no extra work)
    I(z)  = < P g(z), P t >      (score="dot", the first-order change of the target; "cosine" divides
                                   by both norms, so long or large-advantage responses do not dominate)

Both ``g`` and ``t`` are *loss* gradients (POPI's sign), so ``I(z) > 0`` means a step on ``z``
lowers the target loss to first order; flipping both signs leaves ``I`` unchanged. ``P`` is
the projection a ``ProjectionSpec`` names (cropi.projection); ``P t`` of the buffer target
is ``mean |y_z| P g(z)`` because ``P`` is linear, so IIF costs the per-response gradients only.

Policies (what is dropped; the rest is trained on):

- ``ippo``: every response with ``I(z) < 0``.
- ``iif``: the ``floor(p * n_negative)`` most negative responses (never more than the fraction p).
- ``random``: a uniformly random set of responses of the size ``iif`` would drop at that
  step (the control: same influence work, same update size, no information).

A dropped response leaves its group's other members with the advantages of the *full*
group: the advantages are the rollout's estimate of each response's value against its
prompt's baseline, and re-normalising over the survivors would change the kept responses'
signal because of what was dropped (a group with its only correct answer dropped would
turn its best wrong answer positive).

Per-response gradients come from ``cropi.gradients.engine.GradientEngine``: for the batched
projection kinds (``factored``, ``tensorsketch``) one forward and one activation-only backward over
the buffer's rows with the projection hooks; for the others a ``torch.func.vmap`` per response,
projected after. Responses whose advantage is 0 have ``g(z) = 0`` exactly and are skipped (influence
0: never negative, never dropped). The validation target is the same pass over the validation rollouts.

The update shares that pass (``select(..., aggregation=...)``, the lean trainer without a KL term):
with ratio 1 and no KL, each response's share of the update's gradient is a known multiple of its
POPI term's gradient (``update_weights``), and rows do not interact, so the pass keeps every
parameter-owning module's input and output gradient (``cropi.gradients.tape.Tape``) and, once the drop
set is known, forms the kept responses' weighted weight gradient from them (``SharedUpdate``): no
second forward or backward. A projection cannot be un-projected, so what is kept is the modules' own
tensors, as the update's own backward would hold. With a KL term the update runs its own pass.

The I-PPO target uses the validation prompts' own rollouts, sampled once per stage from the
stage's starting policy and reused at every step with POPI's importance ratio
``pi_theta_k / pi_theta_m`` (unclipped): no sampling per step, an unbiased estimate at ``theta_k``,
and within a stage the policy moves little (CROPI's own argument for reusing trajectories). The
target is a mean of per-prompt terms; each is scored at the stage start and re-scored in turn,
``validation_refresh`` prompts a step (default 1), so every term is at most (prompts of all sets) - 1
steps old; ``validation_refresh=None`` re-scores every prompt at every step (the exact target).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from cropi.gradients.engine import GradientEngine, Responses
from cropi.projection.spec import ONLINE_FILTER_SPEC, ProjectionSpec
from cropi.trainers.objective import group_advantages
from cropi.trainers.shared_update import SharedUpdate, update_weights


Policy = Literal["none", "ippo", "iif", "random"]


class OnlineFilterOptions(BaseModel):
    """The filter step of the lean trainer; ``policy="none"`` turns it off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Policy = "none"
    p: float = Field(0.25, gt=0, le=1, description="iif and random: fraction of the negative-influence responses dropped")
    target: Literal["auto", "validation", "buffer"] = Field(
        "auto", description="auto: validation for ippo, buffer (IIF's own objective) for iif and random")
    score: Literal["dot", "cosine"] = "dot"
    projection: ProjectionSpec = ONLINE_FILTER_SPEC  # a purpose of its own, documented there
    validation_files: dict[str, str] = Field(default_factory=dict, description="validation set name -> prompt file")
    validation_prompts: int = Field(8, ge=1, description="prompts per validation set, drawn once per stage")
    validation_rollouts: int = Field(8, ge=2, description="responses per validation prompt (sampled per stage)")
    early_stop_fraction: Optional[float] = Field(
        None, gt=0, le=1, description="end the stage once a step's filtered fraction reaches this (I-PPO)")
    chunk: int = Field(64, ge=1, description="responses per vmap call (bounds memory)")
    validation_refresh: Optional[int] = Field(
        1, ge=1, description="I-PPO target: validation prompts re-scored at each step, in turn across the sets "
        "(each prompt's term is then at most ceil(prompts of all sets / this) - 1 steps old); None: every "
        "prompt at every step (the exact target at theta_k)")
    share_update: bool = Field(
        True, description="batched kinds, no KL: the update's gradient comes from the filter's own forward and "
        "backward (no second pass); False: the update runs its own")

    @model_validator(mode="after")
    def _target_has_data(self) -> "OnlineFilterOptions":
        if self.resolved_target == "validation" and not self.validation_files:
            raise ValueError("the validation target (policy ippo, or target='validation') needs validation_files: "
                             "name -> prompt file")
        return self

    @property
    def resolved_target(self) -> str:
        if self.target != "auto":
            return self.target
        return "validation" if self.policy == "ippo" else "buffer"


# ---------------------------------------------------------------- the policies (pure)


def drop_set(policy: Policy, influence: torch.Tensor, p: float, rng: random.Random) -> list[int]:
    """Indices (ascending) that ``policy`` drops, given one influence score per response."""
    if policy == "none":
        return []
    negative = [i for i in range(len(influence)) if float(influence[i]) < 0]
    if policy == "ippo":
        return negative
    n = math.floor(p * len(negative) + 1e-9)  # the epsilon keeps p * n exact where it is an integer
    if policy == "iif":
        worst = sorted(negative, key=lambda i: (float(influence[i]), i))[:n]
        return sorted(worst)
    if policy == "random":
        return sorted(rng.sample(range(len(influence)), n))
    raise ValueError(f"unknown filter policy {policy!r}: use none, ippo, iif or random")


def scores(grads: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Influence of each row of ``grads`` (n, k) against ``target`` (k,): dot or cosine (0 for a zero row)."""
    dots = grads.double() @ target.double()
    if kind == "dot":
        return dots
    norms = grads.double().norm(dim=1) * target.double().norm()
    return torch.where(norms > 0, dots / norms.clamp(min=1e-300), torch.zeros_like(dots))


@dataclass
class FilterResult:
    """What the filter did at one step."""

    keep: list[int]
    dropped: list[int]
    influence: torch.Tensor
    seconds: float
    update: Optional[SharedUpdate] = None

    def row(self) -> dict:
        n = len(self.influence)
        return {"filtered_fraction": len(self.dropped) / n if n else 0.0,
                "influence_mean": float(self.influence.mean()) if n else 0.0,
                "negative_fraction": float((self.influence < 0).double().mean()) if n else 0.0,
                "filter_s": self.seconds, **({"shared_update": True} if self.update is not None else {})}


class OnlineFilter:
    """The filter step of one stage: its engine, its target, its random stream."""

    def __init__(self, opts: OnlineFilterOptions, model, *, pad_id: int, seed: int, batched: Optional[bool] = None):
        """``batched``: as ``GradientEngine``'s (False: the per-response reference path)."""
        self.opts, self.pad_id = opts, pad_id
        self.engine = GradientEngine(model, opts.projection, chunk=opts.chunk, batched=batched)
        self.rng = random.Random(f"cropi.filter:{seed}")
        self.validation: list[_Validation] = []
        self.steps = 0  # selects so far this stage: which validation prompts the next one re-scores

    def sample_validation(self, sampler, sets: dict[str, list[dict]], reward_fn, cfg) -> None:
        """The I-PPO target's rollouts, from the stage's starting policy (``sets``: name -> prompt rows),
        and every validation prompt's term of the target at that policy."""
        if self.opts.resolved_target != "validation":
            return
        from cropi.rewards import score_responses

        self.validation = []
        for name, rows in sorted(sets.items()):
            rows = self.rng.sample(rows, min(self.opts.validation_prompts, len(rows)))
            groups = sampler.generate([r["ids"] for r in rows], [r["id"] for r in rows], cfg)
            seqs, rewards = [], []
            for r, g in zip(rows, groups):
                seqs += [(r["ids"], s.token_ids) for s in g]
                rewards += [x or 0.0 for x in score_responses(reward_fn, [s.text for s in g], r["answer"])]
            resp = Responses.build(seqs, self.pad_id)
            adv = group_advantages(torch.tensor(rewards), cfg.samples)
            self.validation.append(_Validation(name, resp, adv, self.engine.token_logprobs(resp), len(rows)))
        self.score_validation(None)

    def score_validation(self, step: Optional[int]) -> None:
        """Re-score validation prompts at the live parameters: at ``step`` (0, 1, ...) the step's turn of
        ``validation_refresh`` prompts, or every prompt (``step`` None, or the option None)."""
        per = self.opts.validation_refresh
        if step is None or per is None or any(v.table is None for v in self.validation):
            parts = [(v, list(range(v.n_prompts))) for v in self.validation]
        else:
            # in turn across the sets: prompt 0 of every set, then prompt 1, ...; so every term is at most
            # ceil(total / per) - 1 steps old and each set's terms age alike
            order = sorted((i, j) for j, v in enumerate(self.validation) for i in range(v.n_prompts))
            picked = {order[(step * per + n) % len(order)] for n in range(min(per, len(order)))}
            parts = [(v, sorted(i for i, jj in picked if jj == j)) for j, v in enumerate(self.validation)]
        rows = [(v, i) for v, prompts in parts for i in v.rows_of(prompts)]
        live = [(v, i) for v, i in rows if v.advantages[i] != 0]
        grads = None
        if live:
            grads, _ = self.engine.rows([v.responses.seqs[i] for v, i in live],
                                        torch.stack([v.advantages[i] for v, i in live]),
                                        [v.behavior_of(i) for v, i in live], pad_id=self.pad_id)
        for v, prompts in parts:
            k = v.rollouts
            sums = torch.zeros(len(prompts), self.engine.projector.out_dim, device=self.engine.projector.device)
            for j, (w, i) in enumerate(live):
                if w is v:
                    sums[prompts.index(i // k)] += grads[j]
            v.store(prompts, sums / k)  # POPI: g(s) = -(1/K) sum_k (1/|y_k|) sum_t rho A

    def select(self, seqs: Sequence[tuple[Sequence[int], Sequence[int]]], adv: torch.Tensor, *,
               aggregation: Optional[str] = None) -> FilterResult:
        """Score the buffer at the current parameters and apply the policy. ``aggregation`` (the update's;
        only where the update has no KL term): the result also carries the update's gradient over the kept
        responses, from the same forward and backward (``SharedUpdate``), where the engine is batched."""
        began = time.perf_counter()
        share = aggregation is not None and self.engine.hooks is not None and self.opts.share_update
        if self.opts.resolved_target == "validation":
            self.score_validation(self.steps)
        self.steps += 1
        own = time.perf_counter() - began  # the filter's own seconds (the validation pass is all its own)
        live = torch.nonzero(adv != 0).squeeze(1)
        grads = torch.zeros(len(seqs), self.engine.projector.out_dim, device=self.engine.projector.device)
        tape = None
        if live.numel():
            clock = self.engine.clock.seconds if share else 0.0
            began = time.perf_counter()
            if share:
                grads[live], tape = self.engine.rows([seqs[i] for i in live.tolist()], adv[live], pad_id=self.pad_id,
                                                     tape=True)
            else:
                grads = self.engine.per_response(Responses.build(seqs, self.pad_id), adv)
            passed = time.perf_counter() - began
            hooks = self.engine.clock.seconds - clock if share else passed
            own += hooks
            shared_s = passed - hooks
        began = time.perf_counter()
        influence = scores(grads, self.target(grads, seqs), self.opts.score)
        dropped = drop_set(self.opts.policy, influence, self.opts.p, self.rng)
        gone = set(dropped)
        keep = [i for i in range(len(seqs)) if i not in gone]
        own += time.perf_counter() - began
        update = None
        if share:
            began = time.perf_counter()
            update = self._shared_update(seqs, adv, live, keep, tape, aggregation)
            update.seconds = time.perf_counter() - began + (shared_s if live.numel() else 0.0)
        return FilterResult(keep, dropped, influence.float(), own, update)

    def _shared_update(self, seqs, adv, live, keep, tape, aggregation) -> SharedUpdate:
        lengths = torch.tensor([float(len(r)) for _, r in seqs])
        weights, tokens = update_weights(lengths, keep, aggregation)
        loss = -float((weights * adv.double() * (lengths > 0).double()).sum())  # ratio 1: a POPI term's value is A_r
        params = [p for p in self.engine.model.parameters() if p.requires_grad]
        if tape is None:  # no response carries signal: the gradient is 0 (the update still steps, as without sharing)
            return SharedUpdate({p: torch.zeros_like(p) for p in params}, loss, tokens, 0.0)
        got = tape.gradients(weights[live])
        missing = [n for n, p in self.engine.model.named_parameters() if p.requires_grad and p not in got]
        if missing:
            raise RuntimeError(f"the shared update found no gradient for {missing[:3]} (a parameter used outside "
                               "its module's forward): set online_filter.share_update to false")
        return SharedUpdate(got, loss, tokens, 0.0)

    def target(self, grads: torch.Tensor, seqs) -> torch.Tensor:
        """``P t``: the buffer's sequence-level objective, or the validation sets' mean POPI gradient (each
        prompt's term as last re-scored, ``score_validation``)."""
        if self.opts.resolved_target == "buffer":
            lengths = torch.tensor([float(len(r)) for _, r in seqs], device=grads.device)
            return (lengths[:, None] * grads).mean(0)
        return torch.stack([v.table.mean(0) for v in self.validation]).mean(0)


@dataclass
class _Validation:
    name: str
    responses: Responses
    advantages: torch.Tensor
    behavior: torch.Tensor   # (n, R) log-probs of the stage's starting policy, left-aligned as ``responses``
    n_prompts: int
    table: Optional[torch.Tensor] = None  # (n_prompts, k): each prompt's P g(s), as last re-scored

    @property
    def rollouts(self) -> int:
        return len(self.advantages) // self.n_prompts

    def rows_of(self, prompts: list[int]) -> list[int]:
        k = self.rollouts
        return [p * k + j for p in prompts for j in range(k)]

    def behavior_of(self, i: int) -> list[float]:
        return self.behavior[i, :int(self.responses.lengths[i])].tolist()

    def store(self, prompts: list[int], values: torch.Tensor) -> None:
        if self.table is None:
            self.table = torch.zeros(self.n_prompts, values.shape[1], device=values.device)
        self.table[torch.tensor(prompts, dtype=torch.long)] = values

    def mean_gradient(self, engine: GradientEngine) -> torch.Tensor:
        """Mean over the set's prompts of P g(s), g(s) = -(1/K) sum_k (1/|y_k|) sum_t rho A (POPI), fresh."""
        return engine.summed(self.responses, self.advantages, self.behavior) / (self.rollouts * self.n_prompts)


__all__ = ["FilterResult", "OnlineFilter", "OnlineFilterOptions", "SharedUpdate", "drop_set", "scores",
           "update_weights"]
