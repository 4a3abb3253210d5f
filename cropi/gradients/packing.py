"""Shared-prompt packing: a prompt's K responses in one row, the prompt computed once.

Unpacked, each response is its own row ``[prompt, y_k]`` and the prompt's forward and backward
run K times. Packed, one row ``[prompt, y_1, ..., y_K]`` with

- a block attention mask: a prompt token sees the prompt's earlier tokens; a token of ``y_k``
  sees the whole prompt and the earlier tokens of ``y_k``, never another response;
- positions restarting at ``P`` (the prompt's length) for every response;
- the first token of every response predicted from the prompt's last position.

So every response token sees the same keys at the same positions as in its own row: the K
responses' log-probs are the unpacked ones (up to rounding). The prompt's hidden states are
shared, so the gradient reaching them is the sum of the K responses' gradients: exactly what a
prompt's POPI vector (a sum over its responses) needs, and all it can give. A per-response vector
(the online filters) cannot be separated out of a packed row.

A response drawn more than once (the same tokens) is packed once (``distinct``): its log-probs
depend on the prompt and its own tokens only, so every copy reads the same ones (``expand``), and
each copy keeps its own behavior log-probs, advantage and weight in the loss; the gradient reaching
the shared tokens is the sum of the copies' gradients, as the prompt's tokens already get. Exact, not
an estimate. Short answers sampled at a low temperature repeat a lot: in the lists demo's offline
trajectories 1,848 of the pool's 3,848 informative responses are distinct (254 of 896 in a
validation set of 16 samples), which leaves 0.66 of a stage's scoring tokens.

When packing pays (``should_pack``): a row of ``T`` tokens through a decoder of ``N`` weights,
``L`` layers of width ``d`` costs about ``2 N T`` multiply-adds in its linear layers plus
``4 L d T^2`` in attention (scores and values, every pair under a dense mask). A prompt is
packed when that sum is lower for its packed row than for its K rows, and when the packed row's
attention weights (``heads x T^2`` a layer) are no larger than the hidden states a micro-batch is
budgeted for (``token_budget x d``), so packing never trades a token budget for a T^2 blow-up. Short
responses to long prompts gain the most (the ``lists`` demo: prompts of ~40 tokens, 5-token
responses, K = 8: about 4x fewer tokens); long responses gain nothing and stay unpacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from cropi.gradients.groups import vocab_logprobs


@dataclass(frozen=True)
class ModelShape:
    """What the cost rule needs of a decoder."""

    n_weights: int
    layers: int
    width: int
    heads: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        cfg = model.config
        return cls(n_weights=sum(p.numel() for p in model.parameters()), layers=int(cfg.num_hidden_layers),
                   width=int(cfg.hidden_size), heads=int(cfg.num_attention_heads))

    def row_cost(self, tokens: int) -> float:
        return 2.0 * self.n_weights * tokens + 4.0 * self.layers * self.width * tokens * tokens


def distinct(responses: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The responses drawn, each once in first-drawn order, and for every response its index there."""
    first: dict[tuple[int, ...], int] = {}
    expand = [first.setdefault(tuple(r), len(first)) for r in responses]
    return [list(r) for r in first], expand


def packed_width(prompt: Sequence[int], responses: Sequence[Sequence[int]]) -> int:
    """Tokens of a packed row: the prompt and each distinct response once."""
    return len(prompt) + sum(map(len, distinct(responses)[0]))


def should_pack(prompt: Sequence[int], responses: Sequence[Sequence[int]], shape: ModelShape,
                token_budget: int) -> bool:
    """Whether one packed row costs less than the responses' own rows (module docstring)."""
    if len(responses) < 2:
        return False
    packed = packed_width(prompt, responses)
    prompt_len, response_lens = len(prompt), [len(r) for r in responses]
    if shape.heads * packed * packed > token_budget * shape.width:
        return False
    return shape.row_cost(packed) < sum(shape.row_cost(prompt_len + n) for n in response_lens)


@dataclass
class PackedBatch:
    """Packed rows, left padded to one width, and where each response's log-probs are read.

    Responses are numbered in the order given (row by row), and ``response_mask`` and ``behavior_logp``
    have one row each. A row packs its distinct responses (``distinct``), numbered row by row too:
    response ``r`` is packed as distinct response ``expand[r]``. Distinct response ``u`` of row
    ``source[u]`` has its targets right-aligned in ``targets[u]`` (as
    ``cropi.gradients.batching.MicroBatch``), and ``index[u, j]`` is the position, in the last ``keep``
    positions of its row, of the logits that predict ``targets[u, j]``."""

    input_ids: torch.Tensor        # (B, T)
    token_mask: torch.Tensor       # (B, T) 1 on real tokens
    position_ids: torch.Tensor     # (B, T)
    segments: torch.Tensor         # (B, T) -1 padding, 0 prompt, k + 1 response k
    keep: int
    source: torch.Tensor           # (u,)  per distinct response
    index: torch.Tensor            # (u, L)
    targets: torch.Tensor          # (u, L)
    expand: torch.Tensor           # (n,)  per response: its distinct response
    response_mask: torch.Tensor    # (n, L)
    behavior_logp: torch.Tensor    # (n, L)

    def attention(self, dtype: torch.dtype, device) -> torch.Tensor:
        """The additive (B, 1, T, T) mask: 0 where a query may look, the dtype's minimum elsewhere. A
        padding position sees itself only, so no row of the softmax is empty (NaN in float64 eager)."""
        seg = self.segments.to(device)
        q, k = seg[:, :, None], seg[:, None, :]
        t = seg.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        seen = causal & (((k == 0) & (q >= 0)) | ((k == q) & (q > 0)))
        seen |= torch.eye(t, dtype=torch.bool, device=device) & (q < 0)
        mask = torch.zeros(seen.shape, dtype=dtype, device=device)
        return mask.masked_fill_(~seen, torch.finfo(dtype).min)[:, None]


def build_packed(groups: Sequence[tuple[list[int], list[list[int]], list[list[float]]]], pad_id: int) -> PackedBatch:
    """``(prompt, responses, behavior log-probs)`` per row: one packed row each, its distinct responses once.

    Filled in numpy and handed to torch once: the same values as writing each slice into torch
    tensors (one small torch op a slice), at a tenth of the time (142 against 14 ms for 64 prompts
    of 8 responses); the lists demo's stage scoring spent 1.0 of its 8.3 s here before."""
    packs = [distinct(responses) for _, responses, _ in groups]
    widths = [len(p) + sum(map(len, kept)) for (p, _, _), (kept, _) in zip(groups, packs)]
    total, keep = max(widths), max(w - len(p) for w, (p, _, _) in zip(widths, groups)) + 1
    n, u = sum(len(rs) for _, rs, _ in groups), sum(len(kept) for kept, _ in packs)
    longest = max(len(r) for _, rs, _ in groups for r in rs)
    b = len(groups)
    ids = np.full((b, total), pad_id, dtype=np.int64)
    segments = np.full((b, total), -1, dtype=np.int64)
    positions = np.zeros((b, total), dtype=np.int64)
    source = np.zeros(u, dtype=np.int64)
    index = np.zeros((u, longest), dtype=np.int64)
    targets = np.full((u, longest), pad_id, dtype=np.int64)
    expand = np.zeros(n, dtype=np.int64)
    resp_mask = np.zeros((n, longest), dtype=np.float32)
    beh = np.zeros((n, longest), dtype=np.float32)
    r = d = 0
    for row, ((prompt, responses, behavior), (kept, which), width) in enumerate(zip(groups, packs, widths)):
        start, plen = total - width, len(prompt)
        ids[row, start:start + plen] = prompt
        segments[row, start:start + plen] = 0
        positions[row, start:start + plen] = np.arange(plen)
        at, window = start + plen, total - keep  # window: where the kept logits begin
        for k, response in enumerate(kept):
            m = len(response)
            source[d + k] = row
            if m:
                ids[row, at:at + m] = response
                segments[row, at:at + m] = k + 1
                positions[row, at:at + m] = np.arange(plen, plen + m)
                # token j of y_k is predicted at the position before it; token 0 at the prompt's last one
                index[d + k, longest - m] = start + plen - 1 - window
                index[d + k, longest - m + 1:] = np.arange(at, at + m - 1) - window
                targets[d + k, longest - m:] = response
            at += m
        for k, (response, logp) in enumerate(zip(responses, behavior)):
            m = len(response)
            expand[r] = d + which[k]
            if m:
                resp_mask[r, longest - m:] = 1.0
                beh[r, longest - m:] = np.asarray(logp, dtype=np.float32)
            r += 1
        d += len(kept)
    t = torch.from_numpy
    return PackedBatch(t(ids), t((segments >= 0).astype(np.int64)), t(positions), t(segments), keep, t(source),
                       t(index), t(targets), t(expand), t(resp_mask), t(beh))


def packed_logprobs(model: torch.nn.Module, batch: PackedBatch, device) -> torch.Tensor:
    """log pi of every response token (n, L), right-aligned as ``batch.response_mask``; logits only where
    read. A response packed once for several copies is read once: every copy's row is that read, so the
    gradient reaching it is the sum of the copies'."""
    dtype = next(model.parameters()).dtype
    out = model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention(dtype, device),
                position_ids=batch.position_ids.to(device), logits_to_keep=batch.keep, use_cache=False)
    logits = out.logits
    logp = vocab_logprobs(logits)
    source = batch.source.to(device)[:, None].expand_as(batch.index)
    return logp[source, batch.index.to(device), batch.targets.to(device)][batch.expand.to(device)]
