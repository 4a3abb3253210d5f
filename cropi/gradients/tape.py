"""A batch's weight gradients formed after its backward, for any weighting of its rows (``Tape``).

Used where one forward and one activation-only backward serve two ends: the online filter's
per-response projected gradients (``cropi.gradients.engine``) and the lean update's gradient over
the responses the filter keeps (``cropi.trainers.shared_update``), known only after the pass.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class Tape:
    """Every parameter-owning module's inputs and output gradient from one forward and one activation-only
    backward, so that the weight gradient of any row-weighted sum of the rows' losses is formed after.

    Rows do not interact, so the gradient of ``sum_r w_r L_r`` at a module's output is ``w_r delta_r`` on
    row r (``delta`` that of ``sum_r L_r``), and every parameter's gradient is linear in it: for a linear
    layer ``sum_r w_r delta_r^T x_r`` (bias: ``sum_r w_r delta_r`` over tokens); for the input embedding an
    index_add of ``w_r delta_r`` at the row's tokens; for any other module (RMSNorm's weight, ...) the
    vector-Jacobian product of its own forward, recomputed on its kept input, with ``w_r delta_r``.
    Every module is assumed to map rows to rows along dim 0 (true of a decoder's layers). Padding
    positions' output gradients are zeroed, so padding contributes nothing whatever the model does there.
    """

    def __init__(self, token_mask: torch.Tensor):
        self.mask = token_mask
        self.calls: list[list] = []  # [module, args, kwargs, output gradient (filled by the backward)]

    @contextmanager
    def record(self, model: torch.nn.Module):
        handles = [m.register_forward_hook(self._forward, with_kwargs=True) for m in model.modules()
                   if any(p.requires_grad for p in m.parameters(recurse=False))]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _forward(self, module, args, kwargs, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            call = [module, args, kwargs, None]
            self.calls.append(call)
            output.register_hook(lambda delta: call.__setitem__(3, delta))

    def gradients(self, weights: torch.Tensor) -> dict[torch.nn.Parameter, torch.Tensor]:
        """The gradient of ``sum_r weights[r] * loss_r`` for every trainable parameter of a module that ran."""
        rows = torch.nonzero(weights).squeeze(1).to(self.mask.device)
        every = rows.numel() == len(weights)  # no row to leave out: no copy of the kept tensors
        # one factor per (row, token): the row's weight on its real tokens, 0 on padding
        factor = (weights.to(self.mask.device)[:, None] * self.mask)[rows]
        out: dict[torch.nn.Parameter, torch.Tensor] = {}
        for module, args, kwargs, delta in self.calls:
            params = {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}
            if delta is None or rows.numel() == 0:  # off the loss's path, or no row weighs: zero
                parts = {n: torch.zeros_like(p) for n, p in params.items()}
            else:
                d = delta if every else delta[rows]
                if d.dim() >= 3 and d.shape[1] <= factor.shape[1]:  # (rows, tokens, ...): the LM head sees the last
                    d = d * factor[:, factor.shape[1] - d.shape[1]:].to(d.dtype)[..., None]
                else:
                    d = d * weights.to(d.device, d.dtype)[rows].reshape(-1, *[1] * (d.dim() - 1))
                parts = self._module_grads(module, params, args, kwargs, d, None if every else rows)
            for name, g in parts.items():
                p = params[name]
                out[p] = out[p] + g if p in out else g.to(p.dtype)
        return out

    def _module_grads(self, module, params, args, kwargs, d, rows) -> dict[str, torch.Tensor]:
        n_rows = self.mask.shape[0]

        def take(v):  # the kept rows of a per-row input (all of them when ``rows`` is None)
            per_row = isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == n_rows
            return v[rows] if rows is not None and per_row else v

        if isinstance(module, torch.nn.Linear):
            x = take(args[0])
            d2, x2 = d.reshape(-1, d.shape[-1]), x.reshape(-1, x.shape[-1]).to(d.dtype)
            grads = {"weight": d2.T @ x2}
            if "bias" in params:
                grads["bias"] = d2.sum(0)
            return {n: g for n, g in grads.items() if n in params}
        if isinstance(module, torch.nn.Embedding) and list(params) == ["weight"]:
            tokens = take(args[0]).reshape(-1)
            g = torch.zeros_like(params["weight"], dtype=d.dtype).index_add_(0, tokens, d.reshape(-1, d.shape[-1]))
            if module.padding_idx is not None:  # as F.embedding's backward: the padding row gets no gradient
                g[module.padding_idx] = 0
            return {"weight": g}
        from torch.func import functional_call, vjp

        names = list(params)
        sliced = tuple(take(a) for a in args)
        sliced_kw = {k: take(v) for k, v in kwargs.items()}
        _, pullback = vjp(lambda *ps: functional_call(module, dict(zip(names, ps)), sliced, sliced_kw),
                          *[params[n].detach() for n in names])
        return dict(zip(names, pullback(d.to(params[names[0]].dtype))))
