"""The lean update's gradient formed from the online filter's own pass (no second forward or backward).

Without a KL term, each kept response's share of the update's gradient is a known multiple of its POPI
term's gradient (``update_weights``), and rows of a batch do not interact. So the filter's one forward
and activation-only backward, with every parameter-owning module's input and output gradient kept
(``cropi.gradients.tape.Tape``), yields the kept responses' weighted weight gradient once the drop set
is known (``SharedUpdate``). tests/test_shared_update.py checks it against float64 autograd, one sequence at a
time, and against the update's own two-pass gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class SharedUpdate:
    """The update's gradient over the kept responses, formed from the filter's own pass."""

    grads: dict            # parameter -> gradient of the update's loss (every trainable parameter)
    loss: float
    tokens: float          # response tokens of the kept responses (the token-mean's denominator)
    seconds: float         # the pass's time less the filter's own share (forward, backward, weight gradients)


def update_weights(lengths: torch.Tensor, keep: Sequence[int], aggregation: str) -> tuple[torch.Tensor, float]:
    """Per buffer response, the multiple of its POPI loss term's gradient that is its share of the lean
    update's gradient (0 for a dropped one), and the kept response tokens.

    With ratio 1 and no KL (``cropi.trainers.objective.grpo_loss``), response r adds
    ``-A_r sum_t grad log pi_t`` times ``1/N`` (token-mean, N the kept responses' tokens) or ``1/(n |y_r|)``
    (seq-mean-token-mean, n kept responses); its POPI term's gradient is ``-(A_r/|y_r|) sum_t grad log pi_t``,
    so the multiple is ``|y_r| / N`` or ``1 / n``. A zero-advantage response counts in N and n though its
    gradient is 0."""
    w = torch.zeros(len(lengths), dtype=torch.float64)
    if not keep:
        return w, 0.0
    index = torch.tensor(list(keep), dtype=torch.long)
    tokens = float(lengths[index].sum())
    if aggregation == "token-mean":
        w[index] = lengths[index].double() / max(tokens, 1.0)
    elif aggregation == "seq-mean-token-mean":
        w[index] = 1.0 / len(keep)
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}: use token-mean or seq-mean-token-mean")
    return w, tokens
