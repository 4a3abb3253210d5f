"""Dense Gaussian or Rademacher projection, regenerated from the hash in blocks.

Entry ``R[r, i]`` (row ``r < k``, kept coordinate ``i`` of a parameter with
key ``K``) comes from one hash ``h = coord_hash(K, i * k + r, stream=1)``
read as an unsigned 64-bit word:

- gaussian: ``u1 = (h >> 40) / 2**24``, ``u2 = ((h >> 16) & 0xFFFFFF) / 2**24``,
  ``R = sqrt(-2 ln(1 - u1)) * cos(2 pi u2) / sqrt(k)`` (Box-Muller; mean 0,
  variance 1/k; the 24-bit uniforms cut the tails at about 5.8 sigma);
- rademacher: ``R = (+1 if h < 2**63 else -1) / sqrt(k)``.

R is never held whole: each call regenerates it in (columns x k) blocks of at
most ``max_block_elems`` entries and adds ``values_block @ block``. That costs
k hashes per kept coordinate per call, so this is far slower than SJLT; it is
here for fidelity to CROPI's dense projection and for comparisons.
"""

from __future__ import annotations

import math

import torch

from cropi.errors import InvalidInputError
from cropi.projection.base import Piece, Projector
from cropi.utils.hashing import bit_field, coord_hash_grid, top_bits

DEFAULT_BLOCK_ELEMS = 2**22


def dense_block(kind: str, key: int, idx: torch.Tensor, k: int, stream: int = 1) -> torch.Tensor:
    """Entries ``R[r, i]`` for coordinates ``idx`` (int64) and rows r < k, as a (len(idx), k) float32 block."""
    h = coord_hash_grid(key, idx, k, stream=stream)
    scale = 1.0 / math.sqrt(k)
    if kind == "rademacher":
        return (h < 0).to(torch.float32).mul_(-2.0 * scale).add_(scale)
    u1 = top_bits(h, 24).to(torch.float32).mul_(-(2.0**-24))  # -u1
    u2 = bit_field(h, 16, 24).to(torch.float32).mul_(2.0 * math.pi * 2.0**-24)
    del h
    radius = u1.log1p_().mul_(-2.0).sqrt_().mul_(scale)  # sqrt(-2 ln(1 - u1)) / sqrt(k)
    return radius.mul_(u2.cos_())


class DenseProjector(Projector):
    """Gaussian N(0, 1/k) or Rademacher +-1/sqrt(k) entries from the hash."""

    def __init__(self, *args, max_block_elems: int = DEFAULT_BLOCK_ELEMS, **kwargs):
        super().__init__(*args, **kwargs)
        if self.spec.kind not in ("gaussian", "rademacher"):
            raise InvalidInputError(f"DenseProjector needs kind 'gaussian' or 'rademacher', got {self.spec.kind!r}")
        if max_block_elems < 1:
            raise InvalidInputError(f"max_block_elems must be >= 1, got {max_block_elems}")
        self.max_block_elems = max_block_elems

    def block(self, key: int, idx: torch.Tensor) -> torch.Tensor:
        """R's columns for local coordinates ``idx`` (int64), as a (len(idx), k) float32 block."""
        return dense_block(self.spec.kind, key, idx, self.out_dim)

    def _apply(self, out: torch.Tensor, values: torch.Tensor, piece: Piece, key: int) -> None:
        idx = piece.index()
        step = max(1, self.max_block_elems // self.out_dim)
        for a in range(0, idx.numel(), step):
            out.addmm_(values[:, a : a + step], self.block(key, idx[a : a + step]))
