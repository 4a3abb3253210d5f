"""Projected per-response POPI gradients of a live model (``GradientEngine``), in one pass over a buffer.

The online filter (``cropi.trainers.filters``) scores every response of a GRPO step's buffer by its
projected gradient ``P g(z)``, ``g(z) = grad [ -(1/|y|) sum_t rho_t A(z) ]`` (POPI's per-response
loss, ``cropi.gradients.popi.popi_response_terms``; every path here calls it), at the model's live
parameters, without touching their ``.grad`` or flags.

For the batched projection kinds (``factored``, ``tensorsketch``; cropi.projection.spec.BATCHED_KINDS):
one batched forward and one backward over the buffer's rows with the projection hooks
(cropi.gradients.hooks): each row's ``P g(z)`` is its own sum, no per-response or weight gradient is
formed, and ``chunk`` rows go through a pass. The rows are left padded, so the LM head runs on the
response positions only. With ``tape``, the pass also keeps every parameter-owning module's input and
output gradient (``cropi.gradients.tape.Tape``), so a weighted weight gradient of the rows can be
formed after it (the lean trainer's shared update).

For the other kinds, per-response gradients come from one ``torch.func.vmap`` over ``grad`` of the
per-response loss, with eager attention (sdpa under vmap fails with a mask), right padding and no
attention mask (causal attention never looks at the padding after a row's tokens) and the LM head
applied only at the response positions. Responses whose advantage is 0 have ``g(z) = 0`` exactly and
are skipped.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from cropi.gradients.batching import build_rows
from cropi.gradients.groups import token_logprobs as left_padded_logprobs
from cropi.gradients.popi import popi_response_terms
from cropi.gradients.tape import Tape
from cropi.projection import ProjectionSpec, make_projector
from cropi.projection.spec import is_batched


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
        with self.hooks.capture(mb.attention_mask) as cap, \
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


__all__ = ["GradientEngine", "Responses"]
