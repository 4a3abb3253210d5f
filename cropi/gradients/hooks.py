"""Per-row projected gradients from one batched forward and backward (no weight gradient formed).

``FactoredHooks(model, projector)`` serves the projectors of the batched kinds (``factored``:
Kronecker blocks; ``tensorsketch``: one shared TensorSketch; cropi.projection.spec.BATCHED_KINDS).
Each says what a layer's forward pass keeps (``keep_input``), what a layer's backward adds to each
row (``layer_block``) and what the input embedding adds (``embedding_block``); the hooks below are
the same for both. Described for the factored kind, whose terms the docs use.

It finds the modules that use every parameter the projector covers: ``nn.Linear`` layers, and
the input ``nn.Embedding`` (with tied weights one matrix is both the embedding and the output
layer; its block is the sum of both uses, as its gradient is). Inside ``with hooks.capture(token_mask) as cap``:

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

With ``checkpoint=True`` each decoder layer runs under activation checkpointing
(``torch.utils.checkpoint``, non-reentrant): its forward keeps nothing but its input, and is run again
when the backward reaches it. The hooks then keep a layer's input from that second forward only, and a
``delta`` that arrives before it (a layer whose output's gradient is ready before anything of its region
is recomputed: the last one of a decoder layer) waits for it (``Capture.pending``). Same products, same
numbers; the pass holds one decoder layer's activations instead of all of them, for one more forward.

Dtypes: what a layer's forward keeps and the ``delta`` its backward hands over stay in the model's
dtype (bfloat16 models keep bfloat16 factors: half the memory a pass holds, and the tensor cores'
inputs); ``cap.rows`` and every sum into it are float32 (float64 for a float64 model), and each
projector accumulates its products in float32 or wider. For a float32 or float64 model nothing is
converted, as before. Nothing here reads a value back from the device (``RowGroups`` carries the
groups' sizes from the host), so on CUDA a whole pass is queued without a host synchronisation.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.utils.checkpoint

from cropi.errors import InvalidInputError
from cropi.projection.layers import RowGroups, as_groups

WIDE_OUTPUT = 16  # a layer with out_features above this many times in_features masks its input, not delta


class Capture:
    """What one forward/backward under ``FactoredHooks.capture`` collects."""

    def __init__(self, n_rows: int, projector, mask: torch.Tensor, dtype: torch.dtype,
                 groups: RowGroups | torch.Tensor | None = None, padded: bool = True):
        self.projector = projector
        self.padded = padded  # False: every position is a real token, so masking multiplies by ones
        # groups: row -> the sum it belongs to (a prompt's rows); rows then holds one sum per group
        self.groups = as_groups(groups)
        n_out = n_rows if self.groups is None else self.groups.n
        self.rows = torch.zeros(n_out, projector.out_dim, dtype=dtype, device=mask.device)
        self.mask = mask.to(dtype)[..., None]
        self._masks = {dtype: self.mask}  # the mask in each factor dtype (0/1: exact in any)
        self.inputs: dict[str, torch.Tensor] = {}
        self.anchor: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None
        self.embedded: list[str] = []  # covered parameters used as the input embedding
        self.padding_idx: int | None = None  # the input embedding's padding row (its gradient is always 0)
        # activation checkpointing (FactoredHooks.capture(checkpoint=True)): which forward of a checkpointed layer is
        # running ("first": the pass's, which keeps nothing; "again": the backward's recompute; None: not inside one)
        self.phase: str | None = None
        self.pending: dict[str, torch.Tensor] = {}  # a delta whose layer's input the recompute has not given yet

    def add(self, start: int, stop: int, values: torch.Tensor) -> None:
        self.rows[:, start:stop] += values

    def backward(self, loss: torch.Tensor) -> None:
        """Run the backward pass the hooks listen to (activation gradients only)."""
        if self.anchor is None:
            raise RuntimeError("no forward pass ran under this capture")
        (g,) = torch.autograd.grad(loss, [self.anchor])
        if self.pending:
            raise RuntimeError(f"no recomputed input reached {sorted(self.pending)}: a checkpointed layer ran no forward "
                               "again in the backward")
        if self.padding_idx is not None:  # nn.Embedding never updates its padding row, wherever the token sits
            g = g * (self.tokens != self.padding_idx)[..., None].to(g.dtype)
        for name in self.embedded:
            self.add(*self.projector.embedding_block(name, self.tokens, g.to(self.rows.dtype), self.mask, self.groups))

    def masked(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (rows, tokens, k) zeroed on padding, in ``x``'s dtype; an output layer sees only the last positions.
        A pass without padding returns ``x`` itself: the multiply by ones was one read and write of every layer's
        delta, ~11% of the default path's device time on an H200 (benchmarks/results/gpu/check_before_fold.json's
        profile)."""
        if not self.padded:
            return x
        mask = self._masks.get(x.dtype)
        if mask is None:
            mask = self._masks[x.dtype] = self.mask.to(x.dtype)
        return x * mask[:, mask.shape[1] - x.shape[1]:]


class FactoredHooks:
    """The linear layers a factored projector covers, and their hooks."""

    def __init__(self, model: torch.nn.Module, projector):
        if not getattr(projector, "hook_path", False):
            raise InvalidInputError(f"the batched hooks need a projector of a batched kind (factored, tensorsketch), "
                                    f"got {type(projector).__name__}")
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

    def decoder_layers(self) -> list[torch.nn.Module]:
        """The model's decoder layers (the ``nn.ModuleList`` of ``config.num_hidden_layers`` modules), what
        ``capture(checkpoint=True)`` checkpoints one by one."""
        n = getattr(getattr(self.model, "config", None), "num_hidden_layers", None)
        for module in self.model.modules():
            if isinstance(module, torch.nn.ModuleList) and n and len(module) == n:
                return list(module)
        raise InvalidInputError(f"checkpoint_layers: {type(self.model).__name__} has no list of its "
                                f"num_hidden_layers ({n}) decoder layers to checkpoint; run without checkpoint_layers")

    @contextmanager
    def capture(self, token_mask: torch.Tensor, groups=None, checkpoint: bool = False) -> Iterator[Capture]:
        """Hooks on for one forward and one ``Capture.backward``; ``token_mask`` (rows, tokens): 1 on real tokens
        (a host tensor tells the hooks, without a device read, whether the pass has any padding to mask).
        ``groups``: each row's group 0..n-1 (a host list, ``RowGroups``, or a tensor, read back once):
        ``cap.rows[j]`` is then the sum of the rows of group j, which a kind may form more cheaply than the
        rows themselves (tensorsketch sums a group's gradients before sketching). ``checkpoint``: each decoder
        layer under activation checkpointing (module docstring): less memory, one more forward."""
        param = next(self.model.parameters())
        dtype = torch.promote_types(param.dtype, torch.float32)
        if groups is not None and not isinstance(groups, RowGroups):
            groups = RowGroups.of(groups, param.device)
        padded = token_mask.device.type != "cpu" or not bool(token_mask.all())
        cap = Capture(token_mask.shape[0], self.projector, token_mask.to(param.device), dtype, groups, padded)
        cap.embedded = list(self.embedded)
        cap.padding_idx = getattr(self.embedding, "padding_idx", None)
        handles = [self.embedding.register_forward_hook(lambda m, i, out: self._anchor(cap, i[0], out))]
        for name, module in self.layers:
            handles.append(module.register_forward_hook(self._forward_hook(cap, name, module)))
        if checkpoint:
            handles += [_Checkpointed(layer, cap) for layer in self.decoder_layers()]
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

    def _forward_hook(self, cap: Capture, name: str, module: torch.nn.Linear):
        projector = self.projector
        # an output layer (vocabulary-wide delta) masks its narrow input instead: a copy of x, not of delta
        masks_delta = bool(getattr(projector, "masks_delta", False)) and not (
            module.out_features > WIDE_OUTPUT * module.in_features)

        def forward(module, inputs, output):
            if cap.phase == "first":  # a checkpointed layer's first forward: its input comes again with the recompute
                if output.requires_grad:
                    output.register_hook(backward)
                return
            if name in cap.inputs:
                raise RuntimeError(f"{name} ran twice in one forward: the batched projection needs each projected "
                                   "layer called once per pass")
            if cap.phase == "again":  # the recompute records its ops for autograd: what the hooks do there must not
                with torch.no_grad():  # be among them (checkpoint refuses a recompute that saves more than the pass)
                    return keep(inputs[0].detach(), output)
            return keep(inputs[0], output)

        def keep(x, output):
            # masking what is kept (P_in x_t) zeroes padding's share whatever delta is there; a kind that keeps x_t
            # itself (masks_delta) masks at the backward instead, the narrower of delta_t and x_t (the same
            # products, zero at padding either way), so the layers sharing one input (q, k, v; gate, up) hold one
            # kept tensor, not a masked copy each. Kept
            # in the model's dtype (a float32 / float64 model: as it was; bfloat16: no float32 copy)
            kept = projector.keep_input(name, x)
            cap.inputs[name] = kept if masks_delta else cap.masked(kept)
            if cap.phase == "again":  # the recompute: the hook sits on the first forward's output
                if name in cap.pending:
                    backward(cap.pending.pop(name))
            elif output.requires_grad:
                output.register_hook(backward)

        def backward(delta):
            if name not in cap.inputs:  # checkpointed: delta came before the recompute reached this layer
                cap.pending[name] = delta
                return
            kept = cap.inputs.pop(name)
            if masks_delta:  # the narrower side, a copy freed with this hook: the products at padding are 0 either
                # way, and masking delta itself moved 2.8x the bytes over a Qwen2.5 decoder layer (gate, up: 5.8x)
                if delta.shape[-1] <= kept.shape[-1]:
                    delta = cap.masked(delta)
                else:
                    kept = cap.masked(kept)
            cap.add(*projector.layer_block(name, delta, kept, cap.groups))

        return forward


class _Checkpointed:
    """One decoder layer run under non-reentrant activation checkpointing while a capture lasts (its instance
    ``forward`` replaced; ``remove`` puts it back). Marks on the capture which of the layer's two forwards runs."""

    def __init__(self, layer: torch.nn.Module, cap: Capture):
        self.layer = layer
        self.own = layer.__dict__.get("forward")  # an instance forward set by someone else (put back on remove)
        inner = layer.forward

        def forward(*args, **kwargs):
            calls = 0

            def run(*a, **k):
                nonlocal calls
                calls += 1
                outer, cap.phase = cap.phase, ("first" if calls == 1 else "again")
                try:
                    return inner(*a, **k)
                finally:
                    cap.phase = outer

            # no early stop: it ends a recompute once the saved tensors are back, before the last layers' forward
            # hooks (down_proj's input never came); the flag is read when the forward runs, not in the backward
            with torch.utils.checkpoint.set_checkpoint_early_stop(False):
                return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False, **kwargs)

        layer.forward = forward

    def remove(self) -> None:
        if self.own is None:
            del self.layer.forward
        else:
            self.layer.forward = self.own
