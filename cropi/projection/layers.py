"""What the batched kinds (``factored``, ``tensorsketch``; cropi.projection.spec.BATCHED_KINDS) share.

Both project the 2-d ``.weight`` of linear layers and of the input embedding, every coordinate of a
projected layer (nothing is subsampled), and both serve the batched hook path
(cropi.gradients.hooks), whose per-row blocks ``group_sum`` adds up by prompt.

Which rows make one prompt's sum is a ``RowGroups``, built once per pass from a host-side list: the
number of groups and each group's rows are known on the host, so no layer ever reads them back from
the device (on CUDA every such read is a ``cudaStreamSynchronize``: one per layer stalled the pass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from cropi.projection.base import Piece, Projector


@dataclass(frozen=True)
class RowGroups:
    """Rows of one pass summed by group: ``index`` (rows,) the group of each row on the device, ``n`` the
    number of groups, ``members[j]`` group j's rows in order (a ``slice`` where they are contiguous, else
    an index tensor on the device). Built once per pass (``of``) from host values: no device reads."""

    index: torch.Tensor
    n: int
    counts: tuple[int, ...]
    members: tuple[slice | torch.Tensor, ...]

    @classmethod
    def of(cls, groups: Sequence[int] | torch.Tensor, device=None) -> "RowGroups":
        """From each row's group (0..n-1, every group present); a tensor is read back once, here."""
        host = groups.tolist() if isinstance(groups, torch.Tensor) else [int(g) for g in groups]
        device = device if device is not None else (groups.device if isinstance(groups, torch.Tensor) else "cpu")
        n = max(host) + 1 if host else 0
        rows: list[list[int]] = [[] for _ in range(n)]
        for r, g in enumerate(host):
            rows[g].append(r)
        members = tuple(slice(m[0], m[-1] + 1) if m and m[-1] - m[0] == len(m) - 1
                        else torch.tensor(m, dtype=torch.long, device=device) for m in rows)
        index = groups.to(device) if isinstance(groups, torch.Tensor) else torch.tensor(host, device=device)
        return cls(index, n, tuple(len(m) for m in rows), members)

    def tokens(self, tokens_per_row: int) -> list[int]:
        """Tokens (padded) of each group, rows of ``tokens_per_row`` positions each."""
        return [c * tokens_per_row for c in self.counts]


def as_groups(groups) -> RowGroups | None:
    """``groups`` as ``RowGroups`` (None stays None; a bare tensor of row -> group is read back once)."""
    return groups if groups is None or isinstance(groups, RowGroups) else RowGroups.of(groups)


def group_sum(values: torch.Tensor, groups) -> torch.Tensor:
    """Rows of ``values`` summed by ``groups`` (``RowGroups``, or a tensor row -> group 0..max); the rows
    themselves when None."""
    if groups is None:
        return values
    groups = as_groups(groups)
    out = torch.zeros(groups.n, *values.shape[1:], dtype=values.dtype, device=values.device)
    return out.index_add_(0, groups.index.to(values.device), values)


class LayerProjector(Projector):
    """A projector of whole 2-d weight matrices, computed on the batched hook path."""

    def selects(self, name: str) -> bool:
        """The spec's filter, restricted to 2-d ``.weight`` parameters."""
        shape = self._all.get(name)
        is_weight = name.endswith("weight") and (shape is None or len(shape) == 2)
        return is_weight and super().selects(name)

    @property
    def n_kept(self) -> int:
        return self.n_coords  # nothing is subsampled

    def kept_count(self, name: str) -> int:
        return math.prod(self._shapes[name])

    def _apply(self, out: torch.Tensor, values: torch.Tensor, piece: Piece, key: int) -> None:
        raise NotImplementedError(f"{type(self).__name__}.project does not go through kept-coordinate pieces")
