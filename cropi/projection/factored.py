"""Kronecker-factored projection of linear layers' gradients (LoGra's idea; METHOD.md, "Factored projection").

For a linear layer ``y = W x`` (W: out x in) the gradient of an example is
``G = sum_t delta_t x_t^T``. This kind maps it to the ``factor_out x factor_in`` block

    P_out G P_in^T = sum_t (P_out delta_t) (P_in x_t)^T

with seeded Gaussian ``P_in`` (factor_in x in) and ``P_out`` (factor_out x out), entries
N(0, 1/factor) from the hash (``dense_block``, streams 1 and 2 under the layer's
``name_key``), so E||P_out G P_in^T||_F^2 = ||G||_F^2. The output vector is the blocks,
each flattened row-major, concatenated in parameter order.

Two ways to the same numbers:

- ``project(named_grads)``: from formed gradients ``G`` (for checks, and for benchmarks
  that already hold full gradients);
- ``cropi.gradients.hooks``: from ``P_in x_t`` kept on the forward pass and ``P_out delta_t``
  on the backward pass, so one batched backward gives every example's block and ``G`` is
  never formed.

Which parameters: the 2-d ``.weight`` of each layer the spec's filter selects: linear
layers, and the input embedding (its gradient ``sum_t e_token g_t^T`` has the same outer-
product form, with a one-hot on the output side; with tied weights the output layer adds
its own linear-layer term to the same block). Biases and norm weights (1-d) are not
projected: a documented loss of coverage, measured by benchmarks/fidelity.py. The hooks
refuse a selected parameter used by any other kind of module (exclude it).
"""

from __future__ import annotations

import torch

from cropi.errors import InvalidInputError
from cropi.projection.dense import dense_block
from cropi.projection.inputs import collect_grads
from cropi.projection.layers import LayerProjector, group_sum

IN_STREAM, OUT_STREAM = 1, 2


class FactoredProjector(LayerProjector):
    """Per-layer ``P_out G P_in^T`` blocks, concatenated; see the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.spec.kind != "factored":
            raise InvalidInputError(f"FactoredProjector needs kind 'factored', got {self.spec.kind!r}")
        self.block_size = self.spec.factor_out * self.spec.factor_in
        self._offsets = {name: i * self.block_size for i, name in enumerate(self.param_names)}
        self._mats: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def out_dim(self) -> int:
        return len(self.param_names) * self.block_size

    def offset(self, name: str) -> int:
        """Where the block of ``name`` starts in the output vector."""
        return self._offsets[name]

    def matrices(self, name: str, device=None, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``(P_out^T, P_in^T)`` of layer ``name``: shapes (out, factor_out) and (in, factor_in)."""
        device = torch.device(device) if device is not None else self.device
        key = (name, str(device), dtype)
        if key not in self._mats:
            out_f, in_f = self._shapes[name]
            k = self._keys[name]
            pout = dense_block("gaussian", k, torch.arange(out_f, device=device), self.spec.factor_out, OUT_STREAM)
            pin = dense_block("gaussian", k, torch.arange(in_f, device=device), self.spec.factor_in, IN_STREAM)
            self._mats[key] = (pout.to(dtype), pin.to(dtype))
        return self._mats[key]

    def project(self, named_grads) -> torch.Tensor:
        """Blocks of formed gradients: each tensor (n, out, in); returns float32 (n, out_dim)."""
        grads, n = collect_grads(named_grads, self._shapes, self._all, self.selects)
        out = torch.zeros(n, self.out_dim, dtype=torch.float32, device=self.device)
        for name in self.param_names:
            g = grads[name].to(self.device)
            dtype = torch.promote_types(g.dtype, torch.float32)
            pout, pin = self.matrices(name, dtype=dtype)
            block = torch.einsum("oa,noi,ib->nab", pout, g.to(dtype), pin)
            out[:, self._offsets[name]:self._offsets[name] + self.block_size] = block.reshape(n, -1)
        return out

    # -- the batched hook path (cropi.gradients.hooks): one layer's share of each row's vector ------
    def keep_input(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """What the forward pass keeps of layer ``name``'s input ``x`` (rows, tokens, in): ``P_in x_t``, in
        float32 or wider (a bfloat16 model's inputs are widened first, as the hooks did before handing
        over the model's own dtype)."""
        x = _wide(x)
        return x @ self.matrices(name, device=x.device, dtype=x.dtype)[1]

    def layer_block(self, name: str, delta: torch.Tensor, kept: torch.Tensor, groups: torch.Tensor | None = None
                    ) -> tuple[int, int, torch.Tensor]:
        """(start, stop, values): each row's ``sum_t (P_out delta_t)(P_in x_t)^T``, flattened, at the
        layer's block (summed by ``groups`` when given); ``kept`` is what ``keep_input`` returned (masked)."""
        delta = _wide(delta)
        d = delta @ self.matrices(name, device=delta.device, dtype=delta.dtype)[0]   # (rows, tokens, factor_out)
        block = torch.einsum("bta,btc->bac", d, kept)                                  # (rows, factor_out, factor_in)
        start = self._offsets[name]
        return start, start + self.block_size, group_sum(block.reshape(block.shape[0], -1), groups)

    def embedding_block(self, name: str, tokens: torch.Tensor, g: torch.Tensor, mask: torch.Tensor,
                        groups: torch.Tensor | None = None) -> tuple[int, int, torch.Tensor]:
        """The input embedding's share: its gradient is ``sum_t e_{token_t} g_t^T`` (``g_t`` the gradient at
        the embedding's output), so the block is ``sum_t P_out[:, token_t] (P_in g_t)^T``: a row lookup."""
        pout, pin = self.matrices(name, device=g.device, dtype=g.dtype)
        rows = pout[tokens] * mask                                  # P_out e_token: (rows, tokens, factor_out)
        block = torch.einsum("bta,btc->bac", rows, g @ pin)
        start = self._offsets[name]
        return start, start + self.block_size, group_sum(block.reshape(block.shape[0], -1), groups)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or as it is when already float32 or wider (no copy)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))
