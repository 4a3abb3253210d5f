"""What the batched kinds (``factored``, ``tensorsketch``; cropi.projection.spec.BATCHED_KINDS) share.

Both project the 2-d ``.weight`` of linear layers and of the input embedding, every coordinate of a
projected layer (nothing is subsampled), and both serve the batched hook path
(cropi.gradients.hooks), whose per-row blocks ``group_sum`` adds up by prompt.
"""

from __future__ import annotations

import math

import torch

from cropi.projection.base import Piece, Projector


def group_sum(values: torch.Tensor, groups: torch.Tensor | None) -> torch.Tensor:
    """Rows of ``values`` summed by ``groups`` (row -> group 0..max); the rows themselves when None."""
    if groups is None:
        return values
    out = torch.zeros(int(groups.max()) + 1, *values.shape[1:], dtype=values.dtype, device=values.device)
    return out.index_add_(0, groups, values)


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
