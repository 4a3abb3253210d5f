"""Many prompts' POPI gradients from one backward: the batched path of the ``factored`` and
``tensorsketch`` kinds.

A prompt whose responses are short next to it (``cropi.gradients.packing.should_pack``) is one
packed row, its prompt computed once for all its responses. Otherwise every response is its own
row. Rows are grouped (longest first) into left-padded micro-batches of at most ``token_budget``
padded tokens, whatever prompt they belong to. A micro-batch's loss is

    L = sum_rows -(1/K_s) (1/|y_k|) sum_t rho_{k,t} A_k        (row k of prompt s; POPI's terms)

so the gradient of L at a row's tokens is that of its own prompt's POPI loss (a packed row's
prompt tokens get the sum over its responses, as the prompt's loss does): rows share no tokens,
padding is masked out of the attention and of the hooks, and each row carries its prompt's 1/K
and its own 1/|y_k|. The hooks (``cropi.gradients.hooks``) give each row's share (a factored
block, or a TensorSketch); a prompt's vector is the sum of its rows' shares, over whichever
micro-batches they fell in. No weight gradient is formed (the model's weights are frozen
here: the computer owns ``requires_grad``, as the per-prompt one does).

Prompts whose rewards are all equal (advantages all zero) get no pass at all, as in the
per-prompt path: p_theta and std_theta need no weights, their ESS is absent
(``cropi.gradients.groups.unweighted_diagnostics``). ``raw_norm`` is the norm of the projected
vector, an unbiased estimate of the full gradient's squared norm (the full gradient itself is
never formed).

On CUDA the rows of one prompt sit next to each other in their micro-batch (one slice for the
sketch's grouped products), the groups go to the hooks as host values (no device read-back per
layer), and a micro-batch the device has no memory for is run again in halves (``_fitting``): a
token budget too large for the card costs a retry, not the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from cropi.errors import InvalidInputError
from cropi.gradients.batching import build_rows, plan_micro_batches
from cropi.gradients.groups import (Trajectories, context_limit, diagnostics, fit_to_context, pad_id_of,
                                    rewards_and_base, token_logprobs, unweighted_diagnostics)
from cropi.gradients.options import LossOptions
from cropi.gradients.packing import ModelShape, build_packed, packed_logprobs, packed_width, should_pack
from cropi.gradients.hooks import FactoredHooks
from cropi.gradients.popi import group_advantages, popi_response_terms, sequence_log_weights
from cropi.store.types import GradientRecord

PROMPTS_PER_CALL = 64  # what the gradients job hands compute_many at once (rows are re-packed inside)
_OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


@dataclass
class _Prompt:
    """One prompt's fitted group and what is computed for it."""

    prompt: list[int]
    responses: list[list[int]]
    behavior: list[list[float]]
    truncated: str | None
    adv: torch.Tensor
    base: dict
    rewards: torch.Tensor
    log_w: torch.Tensor = field(default=None)

    @property
    def live(self) -> bool:
        return self.truncated != "prompt" and bool(torch.any(self.adv != 0))


class BatchedComputer:
    """``compute_many(trajs)``: each prompt's projected POPI vector, rows of many prompts per backward."""

    prompts_per_call = PROMPTS_PER_CALL

    def __init__(self, model: torch.nn.Module, projector, options: LossOptions | None = None):
        self.model, self.projector = model, projector
        self.options = options or LossOptions()
        if self.options.advantage != "behavior":
            raise InvalidInputError(f"the batched projections ({projector.spec.kind}) compute CROPI's estimator only "
                                    f"(advantage='behavior'), not advantage={self.options.advantage!r}: project with "
                                    "kind 'sjlt' for it (e.g. projection={'kind': 'sjlt', 'dim': 32768})")
        self.hooks = FactoredHooks(model, projector)
        for p in model.parameters():
            p.requires_grad_(False)  # activation gradients only: the hooks' anchor starts the graph
        self.device = next(model.parameters()).device
        self.pad_id = pad_id_of(model)
        self.max_length = context_limit(model, self.options)
        self.shape = ModelShape.of(model)
        self.pack = True  # False: every response its own row whatever should_pack says (benchmarks compare layouts)
        self.checkpoint_layers = False  # True: decoder layers under activation checkpointing (ModelOptions)

    def compute(self, traj: Trajectories) -> GradientRecord:
        return self.compute_many([traj])[0]

    def compute_many(self, trajs: Sequence[Trajectories]) -> list[GradientRecord]:
        prompts = [self._prepare(t) for t in trajs]
        vectors = self.vectors(prompts)
        return [self._record(p, vectors[i]) for i, p in enumerate(prompts)]

    def vectors(self, prompts: Sequence[_Prompt]) -> torch.Tensor:
        """Each prompt's projected vector (n, out_dim), in float32 or the model's wider dtype; sets the
        ``log_w`` of the live prompts, the only ones the model runs on (the others' rows stay zero)."""
        dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        out = torch.zeros(len(prompts), self.projector.out_dim, dtype=dtype, device=self.device)
        members = [i for i, p in enumerate(prompts) if p.live]
        for i in members:
            prompts[i].log_w = torch.zeros(len(prompts[i].responses), dtype=torch.float64)
        for packed, items in plan_passes(prompts, members, self.shape, self.options.token_budget, self.pack):
            if not packed and self.device.type == "cuda":  # a prompt's rows adjacent: one slice for the cuda engine
                items.sort(key=lambda row: row[0])
            self._fitting(self._packed_batch if packed else self._micro_batch, prompts, items, out)
        return out

    def _fitting(self, run, prompts, items: list, out: torch.Tensor) -> None:
        """``run(prompts, items, out)``, one micro-batch; where the device runs out of memory for it, the same
        items in two halves (each prompt's vector is the sum of its rows' shares, whichever pass they fall
        in, and a pass that fails adds nothing to ``out``), down to one item, which is refused naming the
        options to lower: the job stops cleanly between prompts and resumes from its committed shards."""
        try:
            run(prompts, items, out)
            return
        except _OUT_OF_MEMORY:
            if len(items) < 2:
                what = "row" if run == self._micro_batch else "packed prompt"
                raise InvalidInputError(
                    f"the device ran out of memory on a single {what} (token budget {self.options.token_budget}): "
                    "lower --max-length (loss.max_length) to truncate long responses, or run the model in "
                    "bfloat16 (--model-dtype bfloat16)") from None
        # out of the except clause: the failed pass's tensors (held by its traceback) are freed by now
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        half = len(items) // 2
        self._fitting(run, prompts, items[:half], out)
        self._fitting(run, prompts, items[half:], out)

    def _micro_batch(self, prompts, rows: list[tuple[int, int]], out: torch.Tensor) -> None:
        """Rows ``(prompt, response)`` each its own left-padded row; a prompt's rows summed by the hooks."""
        mb = build_rows([(prompts[i].prompt, prompts[i].responses[k], prompts[i].behavior[k]) for i, k in rows],
                        list(range(len(rows))), self.pad_id)
        # one group per prompt in this micro-batch: cap.rows holds each prompt's sum (a kind may sum before projecting);
        # a host list: the hooks know every group's rows without reading anything back from the device
        local = {i: j for j, i in enumerate(dict.fromkeys(i for i, _ in rows))}
        groups = [local[i] for i, _ in rows]
        self._pass(prompts, rows, mb, mb.attention_mask, groups, list(local), out,
                   lambda: token_logprobs(self.model, mb, self.device))

    def _packed_batch(self, prompts, members: list[int], out: torch.Tensor) -> None:
        """Prompts ``members`` one packed row each (cropi.gradients.packing): the prompt computed once."""
        pb = build_packed([(prompts[i].prompt, prompts[i].responses, prompts[i].behavior) for i in members],
                          self.pad_id)
        rows = [(i, k) for i in members for k in range(len(prompts[i].responses))]
        self._pass(prompts, rows, pb, pb.token_mask, None, members, out,
                   lambda: packed_logprobs(self.model, pb, self.device))

    def _pass(self, prompts, rows, batch, token_mask, groups, owners: list[int], out, logprobs) -> None:
        """One forward and one hooked backward of a batch of live prompts whose responses are ``rows``
        (prompt, response) in the batch's response order; ``cap.rows[j]`` is prompt ``owners[j]``'s sum."""
        beh, mask = batch.behavior_logp.to(self.device), batch.response_mask.to(self.device)
        with self.hooks.capture(token_mask, groups, checkpoint=self.checkpoint_layers) as cap:  # a host mask: moved there
            logp = logprobs()
            log_w = sequence_log_weights(logp.detach(), beh, mask)  # read back after the backward is queued
            adv = torch.stack([prompts[i].adv[k] for i, k in rows]).to(self.device)
            terms = popi_response_terms(logp, beh, mask, adv, self.options.clip_eps)
            k = torch.tensor([len(prompts[i].responses) for i, _ in rows], dtype=terms.dtype, device=self.device)
            cap.backward(-(terms / k).sum())
        out.index_add_(0, torch.tensor(owners, device=self.device), cap.rows.to(out.dtype))
        self._keep_log_w(prompts, rows, log_w)

    @staticmethod
    def _keep_log_w(prompts, rows, log_w: torch.Tensor) -> None:
        log_w = log_w.cpu()  # the pass's one read-back, once its work is queued
        for j, (i, k) in enumerate(rows):
            prompts[i].log_w[k] = log_w[j]

    def _prepare(self, traj: Trajectories) -> _Prompt:
        prompt, responses, behavior, truncated = fit_to_context(traj, self.max_length)
        rewards, base = rewards_and_base(traj, prompt, responses)
        return _Prompt(prompt, responses, behavior, truncated, group_advantages(rewards), base, rewards)

    def _record(self, p: _Prompt, vector: torch.Tensor) -> GradientRecord:
        zeros = np.zeros(self.projector.out_dim, dtype=np.float32)
        if p.truncated == "prompt":
            return GradientRecord(vector=zeros, raw_norm=0.0, status="truncated", **p.base)
        if not p.live:  # rewards all equal (CROPI's advantages are all zero exactly then): never run
            return GradientRecord(vector=zeros, raw_norm=0.0, status="zero_advantage",
                                  **p.base, **unweighted_diagnostics(p.rewards))
        base = p.base | diagnostics(p.log_w, p.rewards)
        raw_norm = float(vector.double().norm())
        if not math.isfinite(raw_norm):
            return GradientRecord(vector=zeros, raw_norm=raw_norm, status="nonfinite", **base)
        status = "truncated" if p.truncated else "ok"
        return GradientRecord(vector=vector.float().cpu().numpy(), raw_norm=raw_norm, status=status, **base)


def plan_passes(prompts: Sequence, members: Sequence[int], shape: ModelShape, token_budget: int,
                pack: bool = True) -> list[tuple[bool, list]]:
    """The passes that run prompts ``members`` (each with ``prompt``, ``responses``): ``(False, rows)``, rows
    ``(prompt, response)`` of the prompts left unpacked, each its own left-padded row, then ``(True, prompts)``,
    the packed ones one row each (``should_pack``); each pass within ``token_budget`` padded tokens, longest
    first. One layout for the gradients' passes and the forward-only weights' (``weight_diagnostics``)."""
    packed = [i for i in members if pack and should_pack(prompts[i].prompt, prompts[i].responses, shape, token_budget)]
    alone = sorted(set(members) - set(packed))
    rows = [(i, k) for i in alone for k in range(len(prompts[i].responses))]
    lengths = [len(prompts[i].prompt) + len(prompts[i].responses[k]) for i, k in rows]
    widths = [packed_width(prompts[i].prompt, prompts[i].responses) for i in packed]
    return ([(False, [rows[j] for j in group]) for group in plan_micro_batches(lengths, token_budget)]
            + [(True, [packed[j] for j in group]) for group in plan_micro_batches(widths, token_budget)])


def weight_diagnostics(model: torch.nn.Module, trajs, options: LossOptions | None = None) -> dict[str, dict]:
    """Prompt id -> the off-policy diagnostics (``diagnostics``: ESS, ESS/K, p_theta, std_theta, log mean
    weight) of its group at ``model``: what the computers would have stored had they run the model on a group
    whose rewards are all equal (they do not). For a refresh whose criterion needs those weights. A no-grad
    forward in the gradients' own layout (``plan_passes``: many prompts a pass, packed where it pays), so the
    weights are theirs up to rounding. A prompt that does not fit the context gets none (the computers store
    none for it).

    Its first version ran one prompt's group a pass: 10.0 s of a 24.4 s stage scoring on the lists demo
    (719 all-equal groups weighed), against 6.7 s for the stage's batched gradient passes with their backward
    (the pool's 481 mixed groups and both validation sets); now 2.5 s (cProfile of ``score_checkpoint``;
    docs/demo.md, "the refresh's cost")."""
    options = options or LossOptions()
    device, pad_id, limit = next(model.parameters()).device, pad_id_of(model), context_limit(model, options)
    shape, out = ModelShape.of(model), {}
    trajs = iter(trajs)
    while chunk := [t for _, t in zip(range(PROMPTS_PER_CALL * 4), trajs)]:  # bounded host memory on a large pool
        prompts = []
        for traj in chunk:
            prompt, responses, behavior, truncated = fit_to_context(traj, limit)
            rewards, _ = rewards_and_base(traj, prompt, responses)
            prompts.append(_Prompt(prompt, responses, behavior, truncated, adv=torch.zeros(len(responses)), base={},
                                   rewards=rewards, log_w=torch.zeros(len(responses), dtype=torch.float64)))
        fits = [i for i, p in enumerate(prompts) if p.truncated != "prompt" and p.responses]
        with torch.no_grad():
            for packed, items in plan_passes(prompts, fits, shape, options.token_budget):
                if packed:
                    batch = build_packed([(prompts[i].prompt, prompts[i].responses, prompts[i].behavior)
                                          for i in items], pad_id)
                    rows = [(i, k) for i in items for k in range(len(prompts[i].responses))]
                    logp = packed_logprobs(model, batch, device)
                else:
                    rows = items
                    batch = build_rows([(prompts[i].prompt, prompts[i].responses[k], prompts[i].behavior[k])
                                        for i, k in rows], list(range(len(rows))), pad_id)
                    logp = token_logprobs(model, batch, device)
                log_w = sequence_log_weights(logp, batch.behavior_logp.to(device), batch.response_mask.to(device))
                BatchedComputer._keep_log_w(prompts, rows, log_w)
        for traj, p in zip(chunk, prompts):
            out[traj.prompt_id] = (dict.fromkeys(unweighted_diagnostics(p.rewards)) if p.truncated == "prompt"
                                   else diagnostics(p.log_w, p.rewards))
    return out
