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

Per-response gradients, for the batched projection kinds (``factored``, ``tensorsketch``;
cropi.projection.spec.BATCHED_KINDS): one batched forward and one backward over the buffer's rows
with the projection hooks (cropi.gradients.hooks): each row's ``P g(z)`` is its own sum, no
per-response or weight gradient is formed, and ``chunk`` rows go through a pass. The rows are left
padded, so the LM head runs on the response positions only. The loss terms are POPI's own
(``cropi.gradients.popi.popi_response_terms``; every path here calls it). The validation target is
the same pass over the validation rollouts.

The update shares that pass (``select(..., aggregation=...)``, the lean trainer without a KL term):
with ratio 1 and no KL, each response's share of the update's gradient is a known multiple of its
POPI term's gradient (``update_weights``), and rows do not interact, so the pass keeps every
parameter-owning module's input and output gradient (``Tape``) and, once the drop set is known, forms
the kept responses' weighted weight gradient from them (``SharedUpdate``): no second forward or
backward. A projection cannot be un-projected, so what is kept is the modules' own tensors, as the
update's own backward would hold. With a KL term the update runs its own pass.

For the other kinds, per-response gradients come from one ``torch.func.vmap`` over ``grad`` of the per-response
loss, with eager attention (sdpa under vmap fails with a mask), right
padding and no attention mask (causal attention never looks at the padding after a row's
tokens) and the LM head applied only at the response positions. Responses whose advantage
is 0 have ``g(z) = 0`` exactly and are skipped (influence 0: never negative, never dropped).

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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from cropi.gradients.batching import build_rows
from cropi.gradients.groups import token_logprobs as left_padded_logprobs
from cropi.gradients.popi import popi_response_terms
from cropi.projection import ProjectionSpec, make_projector
from cropi.projection.spec import is_batched
from cropi.trainers.objective import group_advantages
from cropi.trainers.shared_update import SharedUpdate, Tape, update_weights

Policy = Literal["none", "ippo", "iif", "random"]


class OnlineFilterOptions(BaseModel):
    """The filter step of the lean trainer; ``policy="none"`` turns it off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Policy = "none"
    p: float = Field(0.25, gt=0, le=1, description="iif and random: fraction of the negative-influence responses dropped")
    target: Literal["auto", "validation", "buffer"] = Field(
        "auto", description="auto: validation for ippo, buffer (IIF's own objective) for iif and random")
    score: Literal["dot", "cosine"] = "dot"
    projection: ProjectionSpec = ProjectionSpec(kind="factored")
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


# ---------------------------------------------------------------- per-response gradients


@dataclass
class Responses:
    """One buffer, right padded: ids (n, L); per response its target positions, tokens and mask (n, R)."""

    ids: torch.Tensor
    positions: torch.Tensor   # logits at position t predict token t + 1
    targets: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor     # |y| (float)
    tokens: torch.Tensor      # (n, L): 1 on prompt and response tokens, 0 on padding
    seqs: Optional[list] = None  # the (prompt, response) token lists: the batched path left-pads them itself
    pad_id: int = 0

    @classmethod
    def build(cls, seqs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int) -> "Responses":
        width = max(len(p) + len(r) for p, r in seqs)
        resp = max(max(len(r) for _, r in seqs), 1)
        n = len(seqs)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        positions = torch.zeros((n, resp), dtype=torch.long)
        targets = torch.full((n, resp), pad_id, dtype=torch.long)
        mask = torch.zeros((n, resp))
        tokens = torch.zeros((n, width))
        for i, (p, r) in enumerate(seqs):
            ids[i, :len(p) + len(r)] = torch.tensor(list(p) + list(r))
            tokens[i, :len(p) + len(r)] = 1.0
            k = len(r)
            positions[i, :k] = torch.arange(len(p) - 1, len(p) - 1 + k)
            targets[i, :k] = torch.tensor(list(r), dtype=torch.long)
            mask[i, :k] = 1.0
        return cls(ids, positions, targets, mask, mask.sum(1), tokens, [(list(p), list(r)) for p, r in seqs], pad_id)

    def take(self, index: torch.Tensor) -> "Responses":
        seqs = None if self.seqs is None else [self.seqs[i] for i in index.tolist()]
        return Responses(self.ids[index], self.positions[index], self.targets[index], self.mask[index],
                         self.lengths[index], self.tokens[index], seqs, self.pad_id)


class GradientEngine:
    """Projected per-response POPI gradients of a live model, without touching its ``.grad`` or flags."""

    def __init__(self, model: torch.nn.Module, spec: ProjectionSpec, *, chunk: int = 64,
                 batched: Optional[bool] = None):
        """``batched``: the factored hooks' one-pass path (default for kind factored; True needs it);
        False: per-response gradients through vmap, projected after (the reference the tests compare to)."""
        self.model, self.chunk = model, chunk
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        self.projector = make_projector(spec, shapes, device=next(model.parameters()).device)
        self.names = list(self.projector.param_names)
        self._covered = set(self.names)
        self.hooks = None
        if batched if batched is not None else is_batched(spec):
            from cropi.gradients.hooks import FactoredHooks

            # the hooks call the projector through a clock: its share of a pass shared with the update is
            # the filter's own time (synchronous on CPU; on a GPU it times the kernel launches only)
            self.clock = _Clocked(self.projector)
            self.hooks = FactoredHooks(model, self.clock)

    def rows(self, seqs: Sequence[tuple[Sequence[int], Sequence[int]]], adv: torch.Tensor,
             behavior: Optional[Sequence[Optional[Sequence[float]]]] = None, *, pad_id: int = 0,
             tape: bool = False) -> tuple[torch.Tensor, Optional["Tape"]]:
        """``P g(z)`` of every row (n, k), rows of nonzero advantage only; ``behavior[i]``: row i's behavior
        log-probs (POPI's ratio), None for on-policy (ratio 1). ``tape`` (batched engine): one pass over all
        rows, with every parameter-owning module's input and output gradient kept (``Tape``)."""
        behavior = list(behavior) if behavior is not None else [None] * len(seqs)
        if self.hooks is not None:
            return self._pass(seqs, adv, behavior, pad_id, tape)
        if tape:
            raise ValueError("the update can share only the batched engine's pass")
        out = torch.zeros(len(seqs), self.projector.out_dim, device=self.projector.device)
        for on_policy in (True, False):  # per_response takes one behavior tensor, or None, for all its rows
            part = [i for i, b in enumerate(behavior) if (b is None) == on_policy]
            if not part:
                continue
            resp = Responses.build([seqs[i] for i in part], pad_id)
            beh = None
            if not on_policy:
                beh = torch.zeros_like(resp.mask)
                for j, i in enumerate(part):
                    beh[j, :len(behavior[i])] = torch.tensor(list(behavior[i]), dtype=beh.dtype)
            out[torch.tensor(part)] = self.per_response(resp, adv[torch.tensor(part)], beh)
        return out, None

    def per_response(self, resp: Responses, adv: torch.Tensor, behavior: Optional[torch.Tensor] = None
                     ) -> torch.Tensor:
        """``P g(z)`` for every response (n, k); rows with advantage 0 are exactly 0 and not computed.

        ``behavior`` (n, R): log-probs of the policy that sampled the responses (POPI's ratio);
        None means on-policy (ratio 1).
        """
        from torch.func import functional_call, grad, vmap

        out = torch.zeros(len(adv), self.projector.out_dim, device=self.projector.device)
        live = torch.nonzero(adv != 0).squeeze(1)
        if live.numel() == 0:
            return out
        if self.hooks is not None:
            for part in torch.split(live, self.chunk):
                out[part] = self._rows(resp.take(part), adv[part], None if behavior is None else behavior[part])
            return out
        model, device = self.model, next(self.model.parameters()).device
        trained = {n: p.detach() for n, p in model.named_parameters() if n in self._covered}
        fixed = {n: p.detach() for n, p in model.named_parameters() if n not in self._covered}
        fixed |= dict(model.named_buffers())

        def loss(params, ids, pos, tgt, mask, a, beh):
            logits = functional_call(model, (params, fixed), (ids[None],),
                                     {"use_cache": False, "logits_to_keep": pos}).logits[0]
            lp = torch.log_softmax(logits.float(), dim=-1).gather(1, tgt[:, None])[:, 0]
            old = lp.detach() if behavior is None else beh  # on-policy: rho = 1, grad rho = grad log pi
            return -popi_response_terms(lp[None], old[None], mask[None], a[None])[0]

        sub = resp.take(live)
        beh = (behavior[live] if behavior is not None else torch.zeros_like(sub.mask)).to(device)
        # chunk_size only when needed: vmap concatenates chunk results, a copy of every gradient
        chunk = self.chunk if len(live) > self.chunk else None
        per = vmap(grad(loss), in_dims=(None, 0, 0, 0, 0, 0, 0), chunk_size=chunk)
        with _eager(model):
            grads = per(trained, sub.ids.to(device), sub.positions.to(device), sub.targets.to(device),
                        sub.mask.to(device), adv[live].to(device, torch.float32), beh)
        out[live] = self.projector.project((n, grads[n]) for n in self.names)
        return out

    def summed(self, resp: Responses, adv: torch.Tensor, behavior: torch.Tensor) -> torch.Tensor:
        """``P`` of the gradient of sum_z POPI loss(z), from one batched backward (k,)."""
        if self.hooks is not None:
            return self.per_response(resp, adv, behavior).sum(0)
        from torch.func import functional_call

        model, device = self.model, next(self.model.parameters()).device
        trained = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters() if n in self._covered}
        fixed = {n: p.detach() for n, p in model.named_parameters() if n not in self._covered}
        fixed |= dict(model.named_buffers())
        logits = functional_call(model, (trained, fixed), (resp.ids.to(device),), {"use_cache": False}).logits
        lp = _picked_logprobs(logits, resp, device)
        loss = -popi_response_terms(lp, behavior.to(device), resp.mask.to(device), adv.to(device)).sum()
        grads = torch.autograd.grad(loss, list(trained.values()), allow_unused=True)
        by_name = {n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(trained.items(), grads)}
        return self.projector.project((n, by_name[n][None]) for n in self.names)[0]

    def _rows(self, resp: Responses, adv: torch.Tensor, behavior: Optional[torch.Tensor]) -> torch.Tensor:
        """``per_response``'s batched path on one chunk: ``_pass`` with the behavior log-probs as lists."""
        beh = None if behavior is None else [behavior[i, :int(n)].tolist() for i, n in enumerate(resp.lengths)]
        return self._pass(resp.seqs, adv, beh or [None] * len(resp.seqs), resp.pad_id, False)[0]

    def _pass(self, seqs, adv: torch.Tensor, behavior: list, pad_id: int, tape: bool
              ) -> tuple[torch.Tensor, Optional["Tape"]]:
        """Projected ``g(z)`` of each row from one forward and one activation-only backward.

        The rows are left padded here (``cropi.gradients.batching.build_rows``, as the gradients job's
        batched path): every response then ends at the last position, so the LM head runs on the last
        ``max |y| + 1`` positions only (``logits_to_keep``) instead of every prompt position, which was
        most of this pass's cost on short responses. Rows may mix on-policy responses (ratio 1) and
        off-policy ones (the validation rollouts): rows do not interact, so each row's block is its own."""
        device = next(self.model.parameters()).device
        mb = build_rows([(p, r, b if b is not None else [0.0] * len(r)) for (p, r), b in zip(seqs, behavior)],
                        list(range(len(seqs))), pad_id)
        on_policy = torch.tensor([b is None for b in behavior], device=device)[:, None]
        recorder = Tape(mb.attention_mask.to(device)) if tape else None
        with self.hooks.capture(mb.attention_mask.to(device)) as cap, \
                (recorder.record(self.model) if recorder else nullcontext()):
            lp = left_padded_logprobs(self.model, mb, device)
            mask = mb.response_mask.to(device)
            old = torch.where(on_policy, lp.detach(), mb.behavior_logp.to(device, lp.dtype))  # on-policy: rho = 1
            cap.backward(-popi_response_terms(lp, old, mask, adv.to(device)).sum())
        return cap.rows.to(self.projector.device, torch.float32), recorder

    def token_logprobs(self, resp: Responses) -> torch.Tensor:
        """Teacher-forced log-probs of the response tokens (n, R), no gradient."""
        device = next(self.model.parameters()).device
        with torch.no_grad():
            return _picked_logprobs(self.model(input_ids=resp.ids.to(device), use_cache=False).logits, resp, device)


class _Clocked:
    """A projector whose hook-path methods (what ``FactoredHooks`` calls per layer) add their seconds to
    ``seconds``; everything else is the projector's own."""

    def __init__(self, projector):
        self._projector, self.seconds = projector, 0.0

    def __getattr__(self, name):
        return getattr(self._projector, name)

    def _timed(self, method: str, *args):
        began = time.perf_counter()
        try:
            return getattr(self._projector, method)(*args)
        finally:
            self.seconds += time.perf_counter() - began

    def keep_input(self, *args):
        return self._timed("keep_input", *args)

    def layer_block(self, *args):
        return self._timed("layer_block", *args)

    def embedding_block(self, *args):
        return self._timed("embedding_block", *args)


def _picked_logprobs(logits: torch.Tensor, resp: Responses, device) -> torch.Tensor:
    """log pi of each response token (n, R) from full logits (n, L, V) of right-padded rows."""
    pos = resp.positions.to(device)[..., None].expand(-1, -1, logits.shape[-1])
    picked = torch.log_softmax(logits.gather(1, pos).float(), dim=-1)
    return picked.gather(2, resp.targets.to(device)[..., None])[..., 0]


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


@contextmanager
def _eager(model):
    """Eager attention for the duration (sdpa under vmap fails with masks); the policy's own restored after."""
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    try:
        yield
    finally:
        cfg._attn_implementation = before


__all__ = ["FilterResult", "GradientEngine", "OnlineFilter", "OnlineFilterOptions", "Responses", "SharedUpdate",
           "drop_set", "scores", "update_weights"]
