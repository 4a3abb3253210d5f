"""Projected gradients of one split read into memory: ids, an (n, k) matrix, metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import numpy as np
import pyarrow as pa

from cropi.errors import MismatchError, NotFoundError

from cropi.contracts import GRADIENT_META_COLUMNS as META_COLUMNS
from cropi.contracts import GRADIENT_OPTIONAL_COLUMNS as OPTIONAL_COLUMNS
from cropi.contracts import GRADIENT_STATUSES

if TYPE_CHECKING:
    from cropi.store.types import CheckpointRef


def vectors_from_arrow(column: pa.ChunkedArray, dim: int, dtype: str) -> np.ndarray:
    """An (n, dim) array over a fixed_size_list column: a read-only view of the Arrow
    buffer (memory the reader owns, never a file mapping) when the column is one
    chunk, else one copy."""
    if column.num_chunks == 0 or len(column) == 0:
        return np.empty((0, dim), dtype=dtype)
    arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    values = arr.flatten().to_numpy(zero_copy_only=True)  # flatten() honours slice offsets
    return values.reshape(len(arr), dim)


@dataclass
class GradientTable:
    """One split's projected gradients; row ``i`` of ``vectors`` belongs to ``prompt_ids[i]``."""

    prompt_ids: list[str]
    vectors: np.ndarray
    columns: dict[str, np.ndarray]
    checkpoint: "CheckpointRef"
    spec: dict
    split: str
    _positions: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_arrow(cls, table: pa.Table, checkpoint: "CheckpointRef", spec: dict, split: str,
                   dim: int, dtype: str) -> "GradientTable":
        columns = {c: table.column(c).to_numpy() for c in META_COLUMNS}
        columns |= {c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
                    for c in OPTIONAL_COLUMNS if c in table.column_names}
        return cls(table.column("prompt_id").to_pylist(), vectors_from_arrow(table.column("vector"), dim, dtype),
                   columns, checkpoint, spec, split)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def ess(self) -> np.ndarray | None:
        """Per-row effective sample size (NaN where unknown); None for a split stored without it."""
        return self.columns.get("ess")

    @property
    def ess_fraction(self) -> np.ndarray | None:
        """ESS / K per row (NaN where unknown); None for a split stored without it."""
        return self.columns.get("ess_fraction")

    @property
    def p_theta(self) -> np.ndarray | None:
        """Importance-weighted pass rate at the checkpoint per row (NaN where unknown); None for a
        split stored without it."""
        return self.columns.get("p_theta")

    @property
    def std_theta(self) -> np.ndarray | None:
        """Importance-weighted reward std at the checkpoint per row (NaN where unknown); None for a
        split stored without it."""
        return self.columns.get("std_theta")

    @property
    def log_mean_weight(self) -> np.ndarray | None:
        """log of the mean sequence weight per row (NaN where unknown); None for a split stored without it."""
        return self.columns.get("log_mean_weight")

    @property
    def spec_id(self) -> str:
        return self.spec.get("spec_id", "")

    def index(self, prompt_id: str) -> int:
        """Row of ``prompt_id``; NotFoundError if this split has no gradient for it."""
        try:
            return self._position_map()[prompt_id]
        except KeyError:
            raise NotFoundError(f"no gradient for prompt {prompt_id!r} in split {self.split!r} "
                                f"(checkpoint {self.checkpoint.name}); compute it first") from None

    def get(self, prompt_ids: Iterable[str]) -> "GradientTable":
        """The rows of ``prompt_ids``, in that order; NotFoundError naming any unknown id."""
        wanted = list(prompt_ids)
        positions = self._position_map()
        unknown = [p for p in wanted if p not in positions]
        if unknown:
            raise NotFoundError(f"{len(unknown)} prompt ids have no gradient in split {self.split!r} "
                                f"(checkpoint {self.checkpoint.name}): {unknown[:5]}")
        rows = np.array([positions[p] for p in wanted], dtype=np.int64)
        return GradientTable(wanted, self.vectors[rows], {c: v[rows] for c, v in self.columns.items()},
                             self.checkpoint, self.spec, self.split)

    def replace_rows(self, other: "GradientTable") -> "GradientTable":
        """This split with the rows of ``other``'s prompts taken from ``other`` (a refresh's
        recomputed prompts), in this split's order; columns either lacks are dropped.
        MismatchError unless the two are comparable and ``other``'s prompts are all here."""
        self.ensure_comparable(other)
        positions = self._position_map()
        foreign = [p for p in other.prompt_ids if p not in positions]
        if foreign:
            raise MismatchError(f"{len(foreign)} prompts of split {other.split!r} are not in split {self.split!r} "
                                f"(e.g. {foreign[:3]}): only prompts of the split can replace its rows")
        rows = np.array([positions[p] for p in other.prompt_ids], dtype=np.int64)
        vectors = self.vectors.copy()
        vectors[rows] = other.vectors
        columns = {}
        for c in self.columns.keys() & other.columns.keys():
            col = self.columns[c].copy()
            col[rows] = other.columns[c]
            columns[c] = col
        return GradientTable(list(self.prompt_ids), vectors, columns, self.checkpoint, self.spec, self.split)

    def _position_map(self) -> dict[str, int]:
        if self._positions is None:
            self._positions = {p: i for i, p in enumerate(self.prompt_ids)}
        return self._positions

    def ensure_comparable(self, other: "GradientTable") -> None:
        """MismatchError unless both were projected with one spec at one checkpoint."""
        problems = []
        if self.spec_id != other.spec_id:
            problems.append(f"projection spec_id {self.spec_id!r} ({self.split}) vs {other.spec_id!r} ({other.split})")
        if self.checkpoint.fingerprint != other.checkpoint.fingerprint:
            problems.append(f"checkpoint fingerprint {self.checkpoint.fingerprint!r} ({self.checkpoint.name}) "
                            f"vs {other.checkpoint.fingerprint!r} ({other.checkpoint.name})")
        if problems:
            raise MismatchError("gradients are not comparable: " + "; ".join(problems)
                                + ". Compute both splits with the same projection spec at the same checkpoint")
