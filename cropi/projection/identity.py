"""Identity "projection": the kept coordinates themselves, g[S].

The output lays the kept coordinates out parameter by parameter in
``param_names`` order, each parameter's in ascending flat index order, so its
length is ``n_kept``. Useful for small models and exact (unprojected) checks;
it refuses when ``n_kept`` exceeds the spec's ``identity_limit``.
"""

from __future__ import annotations

import torch

from cropi.errors import InvalidInputError
from cropi.projection.base import Piece, Projector


class IdentityLimitError(InvalidInputError):
    """An identity projection would emit more coordinates than allowed."""


class IdentityProjector(Projector):
    """Returns g[S]; its ``out_dim`` is the exact kept count."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        limit = self.spec.identity_limit
        total = 0
        for name in self.param_names:  # counts as it goes, so a huge model fails early
            total += self.kept_count(name)
            if total > limit:
                raise IdentityLimitError(
                    f"identity projection keeps more than identity_limit={limit} coordinates "
                    f"({total} after {name!r}, of {self.n_coords} in all): lower kept_fraction, narrow "
                    "include/exclude, use kind='sjlt', or raise identity_limit")
        self._n_kept = total

    @property
    def out_dim(self) -> int:
        return self._n_kept

    def _apply(self, out: torch.Tensor, values: torch.Tensor, piece: Piece, key: int) -> None:
        out[:, piece.offset : piece.offset + values.shape[1]] = values
