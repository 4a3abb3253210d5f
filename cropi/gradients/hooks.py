"""Per-row factored gradient blocks from one batched forward and backward (no weight gradient formed).

``FactoredHooks(model, projector)`` finds the modules that use every parameter a
``FactoredProjector`` covers: ``nn.Linear`` layers, and the input ``nn.Embedding`` (with tied
weights one matrix is both the embedding and the output layer; its block is the sum of both
uses, as its gradient is). Inside ``with hooks.capture(token_mask) as cap``:

- the forward hook of each linear layer keeps ``P_in x_t`` (zeroed where ``token_mask`` is 0, so
  padding contributes nothing whatever the model computes there) and puts a hook on the
  layer's output;
- that hook, when the backward pass reaches it, turns ``delta_t`` into ``P_out delta_t``
  and adds each row's ``sum_t (P_out delta_t)(P_in x_t)^T`` to ``cap.rows`` (rows x out_dim);
- the input embedding's output is the pass's anchor: ``cap.backward(loss)`` differentiates
  ``loss`` with respect to it only, so autograd computes activation gradients and skips
  every weight gradient (and the model's ``requires_grad`` flags and ``.grad`` are untouched).
  The embedding's own gradient is ``sum_t e_{token_t} g_t^T`` (``g_t`` the anchor's gradient),
  so its block is ``sum_t P_out[:, token_t] (P_in g_t)^T``: a row lookup, no matrix formed.

Rows share no tokens, so the gradient of the summed loss at a row's token is that of the
row's own loss term: ``cap.rows[b]`` is exactly the factored projection of the gradient of
row b's term (METHOD.md, "Factored projection").
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from cropi.errors import InvalidInputError
from cropi.projection.factored import FactoredProjector


class Capture:
    """What one forward/backward under ``FactoredHooks.capture`` collects."""

    def __init__(self, n_rows: int, out_dim: int, mask: torch.Tensor, dtype: torch.dtype):
        self.rows = torch.zeros(n_rows, out_dim, dtype=dtype, device=mask.device)
        self.mask = mask.to(dtype)[..., None]
        self.inputs: dict[str, torch.Tensor] = {}
        self.anchor: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None
        self.embedding_blocks = []  # (start, stop, P_out^T, P_in^T) of a covered input embedding

    def backward(self, loss: torch.Tensor) -> None:
        """Run the backward pass the hooks listen to (activation gradients only)."""
        if self.anchor is None:
            raise RuntimeError("no forward pass ran under this capture")
        (g,) = torch.autograd.grad(loss, [self.anchor])
        for start, stop, pout, pin in self.embedding_blocks:
            rows = pout[self.tokens] * self.mask                    # P_out e_token: (rows, tokens, factor_out)
            block = torch.einsum("bta,btc->bac", rows, g.to(self.rows.dtype) @ pin)
            self.rows[:, start:stop] += block.reshape(block.shape[0], -1)

    def masked(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (rows, tokens, k) zeroed on padding; an output layer sees only the last positions."""
        return x * self.mask[:, self.mask.shape[1] - x.shape[1]:]


class FactoredHooks:
    """The linear layers a factored projector covers, and their hooks."""

    def __init__(self, model: torch.nn.Module, projector: FactoredProjector):
        if not isinstance(projector, FactoredProjector):
            raise InvalidInputError(f"factored hooks need a factored projector, got {type(projector).__name__}")
        self.model, self.projector = model, projector
        self.embedding = model.get_input_embeddings()
        params = dict(model.named_parameters())
        self.layers: list[tuple[str, torch.nn.Linear]] = []
        self.embedded: list[str] = []  # covered parameters used as the input embedding
        for name in projector.param_names:
            users = [m for m in model.modules() if getattr(m, "weight", None) is params[name]]
            for module in users:
                if isinstance(module, torch.nn.Linear):
                    self.layers.append((name, module))
                elif module is self.embedding:
                    self.embedded.append(name)
                else:
                    raise InvalidInputError(
                        f"factored projection covers {name!r}, a weight of {type(module).__name__}: it projects "
                        "nn.Linear weights and the input embedding only; exclude it with the spec's exclude")

    @contextmanager
    def capture(self, token_mask: torch.Tensor) -> Iterator[Capture]:
        """Hooks on for one forward and one ``Capture.backward``; ``token_mask`` (rows, tokens): 1 on real tokens."""
        param = next(self.model.parameters())
        dtype = torch.promote_types(param.dtype, torch.float32)
        cap = Capture(token_mask.shape[0], self.projector.out_dim, token_mask.to(param.device), dtype)
        for name in self.embedded:
            start = self.projector.offset(name)
            cap.embedding_blocks.append((start, start + self.projector.block_size,
                                         *self.projector.matrices(name, device=param.device, dtype=dtype)))
        handles = [self.embedding.register_forward_hook(lambda m, i, out: self._anchor(cap, i[0], out))]
        for name, module in self.layers:
            handles.append(module.register_forward_hook(self._forward_hook(cap, name)))
        try:
            yield cap
        finally:
            for h in handles:
                h.remove()

    @staticmethod
    def _anchor(cap: Capture, tokens: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if not out.requires_grad:
            out.requires_grad_(True)  # frozen weights: start the graph here
        cap.anchor, cap.tokens = out, tokens
        return out

    def _forward_hook(self, cap: Capture, name: str):
        pout, pin = self.projector.matrices(name, device=cap.rows.device, dtype=cap.rows.dtype)
        start = self.projector.offset(name)
        stop = start + self.projector.block_size

        def forward(module, inputs, output):
            if name in cap.inputs:
                raise RuntimeError(f"{name} ran twice in one forward: factored projection needs each projected "
                                   "layer called once per pass")
            cap.inputs[name] = cap.masked(inputs[0].to(cap.rows.dtype) @ pin)
            if output.requires_grad:
                output.register_hook(backward)

        def backward(delta):
            d = delta.to(cap.rows.dtype) @ pout                        # (rows, tokens, factor_out)
            block = torch.einsum("bta,btc->bac", d, cap.inputs.pop(name))  # (rows, factor_out, factor_in)
            cap.rows[:, start:stop] += block.reshape(block.shape[0], -1)

        return forward
