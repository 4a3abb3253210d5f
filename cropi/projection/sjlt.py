"""Sparse JL projection (count-sketch family), cost O(|S| * nnz) whatever k is.

Column ``i`` (a kept coordinate of a parameter with key ``K``) has exactly
``nnz`` nonzeros, one in each of ``nnz`` row blocks (Kane-Nelson block
construction, so they never collide). Block ``j`` covers rows
``[floor(j*k/nnz), floor((j+1)*k/nnz))`` of size ``b_j``; with
``h = coord_hash(K, i, stream=1+j)`` read as an unsigned 64-bit word::

    row_j  = floor(j*k/nnz) + (h >> 1) mod b_j
    sign_j = +1 if h & 1 == 0 else -1
    R[row_j, i] = sign_j / sqrt(nnz)

Every column has unit norm, so ``E ||R x||^2 = ||x||^2``.

Implementation: the sign is folded into the row index (``row + k`` for a
negative sign), all contributions are summed with ``index_add_`` into an
(n, 2k) buffer, and the two halves are subtracted at the end: no
per-coordinate multiplication, and int64 indices (torch's fast path on CPU).
Cached plans cost ``8 * nnz`` bytes per kept coordinate (plus 4 for the
kept index when kept_fraction < 1).
"""

from __future__ import annotations

import math

import torch

from cropi.projection.base import Piece, Plan, Projector
from cropi.utils.hashing import bit_field, coord_hash


def block_bounds(dim: int, nnz: int) -> list[tuple[int, int]]:
    """(first row, size) of each of the ``nnz`` row blocks."""
    edges = [j * dim // nnz for j in range(nnz + 1)]
    return [(edges[j], edges[j + 1] - edges[j]) for j in range(nnz)]


class SJLTProjector(Projector):
    """``nnz`` hashed +-1/sqrt(nnz) entries per kept column; see the module docstring."""

    def _plan_cols(self, key: int, plan: Plan) -> dict[str, torch.Tensor]:
        idx = plan.index()
        k = self.out_dim
        rows = torch.empty(self.spec.nnz, idx.numel(), dtype=torch.int64, device=idx.device)
        for j, (first, size) in enumerate(block_bounds(k, self.spec.nnz)):
            h = coord_hash(key, idx, stream=1 + j)
            row = bit_field(h, 1, 63).remainder_(size).add_(first)
            rows[j] = row + bit_field(h, 0, 1) * k  # negative sign -> upper half of the buffer
        return {"rows": rows}

    def _new_out(self, n: int) -> torch.Tensor:
        return torch.zeros(n, 2 * self.out_dim, dtype=torch.float32, device=self.device)

    def _apply(self, out: torch.Tensor, values: torch.Tensor, piece: Piece, key: int) -> None:
        rows = piece.col("rows")
        for j in range(rows.shape[0]):
            out.index_add_(1, rows[j], values)

    def _finish(self, out: torch.Tensor) -> torch.Tensor:
        k = self.out_dim
        return (out[:, :k] - out[:, k:]).mul_(1.0 / math.sqrt(self.spec.nnz))
