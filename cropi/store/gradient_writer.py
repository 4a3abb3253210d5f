"""Buffered writing of projected gradients into one split, a shard per ``rows_per_shard`` rows."""

from __future__ import annotations

import operator
import numpy as np
import pyarrow as pa

from cropi.errors import InvalidInputError
from cropi.store.sharded import BufferedWriter, ShardedDataset
from cropi.store.types import GRADIENT_STATUSES, GradientRecord


class GradientWriter(BufferedWriter):
    """Buffers gradient rows and commits them ``rows_per_shard`` at a time (and on flush/close).

    Given the split's dataset, vector length and dtype (``GradientSplit.writer`` hands them over), so
    the writer needs nothing of the split's module."""

    what = "gradients"

    def __init__(self, dataset: ShardedDataset, dim: int, dtype: str, writer_id: str, rows_per_shard: int = 64):
        if isinstance(rows_per_shard, bool) or not isinstance(rows_per_shard, int) or rows_per_shard < 1:
            raise InvalidInputError(f"rows_per_shard must be a positive integer, got {rows_per_shard!r}")
        self.dataset, self.dim, self.dtype = dataset, dim, dtype
        self.rows_per_shard = rows_per_shard
        super().__init__(dataset.writer(writer_id))
        self._rows: list[dict] = []

    def write(self, record: GradientRecord) -> None:
        """Buffer one prompt's gradient; commits a shard when the buffer is full."""
        self.append(**vars(record))

    def append(self, prompt_id: str, vector: np.ndarray, raw_norm: float, n_responses: int,
               reward_mean: float, reward_std: float, n_tokens: int, status: str,
               ess: float | None = None, ess_fraction: float | None = None, p_theta: float | None = None,
               std_theta: float | None = None, log_mean_weight: float | None = None) -> None:
        """``write`` with the record's fields as arguments."""
        if self._closed:
            raise InvalidInputError("this gradient writer is closed; open a new one with split.writer(...)")
        if not isinstance(prompt_id, str) or not prompt_id:
            raise InvalidInputError(f"prompt_id must be a non-empty string, got {prompt_id!r}")
        if prompt_id in self._shard.committed_keys() or any(r["prompt_id"] == prompt_id for r in self._rows):
            raise InvalidInputError(f"prompt {prompt_id!r} already has a gradient from writer "
                                    f"{self._shard.writer_id}; skip committed prompts")
        if status not in GRADIENT_STATUSES:
            raise InvalidInputError(f"prompt {prompt_id!r}: status {status!r} is not one of {GRADIENT_STATUSES}")
        self._rows.append({"prompt_id": prompt_id, "vector": self._cast(prompt_id, vector),
                           "raw_norm": float(raw_norm), "n_responses": _count(n_responses, "n_responses"),
                           "reward_mean": float(reward_mean), "reward_std": float(reward_std),
                           "n_tokens": _count(n_tokens, "n_tokens"), "status": status,
                           "ess": _optional_float(ess), "ess_fraction": _optional_float(ess_fraction),
                           "p_theta": _optional_float(p_theta), "std_theta": _optional_float(std_theta),
                           "log_mean_weight": _optional_float(log_mean_weight)})
        if len(self._rows) >= self.rows_per_shard:
            self.flush()

    def _cast(self, prompt_id: str, vector) -> np.ndarray:
        v = np.asarray(vector)
        if v.shape != (self.dim,) or v.dtype.kind not in "fiu":
            raise InvalidInputError(f"prompt {prompt_id!r}: vector has shape {v.shape} and dtype {v.dtype}, "
                                    f"this split stores numeric vectors of length {self.dim}")
        with np.errstate(over="ignore", invalid="ignore"):
            out = v.astype(self.dtype)
            overflow = np.isfinite(v) & ~np.isfinite(out)
        if overflow.any():
            raise InvalidInputError(f"prompt {prompt_id!r}: vector values overflow {self.dtype} "
                                    f"(max |v| = {np.abs(v).max():.3g}); store this split as float32")
        return out

    def flush(self) -> None:
        """Commit the buffered rows as one shard (nothing if the buffer is empty)."""
        if not self._rows:
            return
        schema = self.dataset.schema
        vectors = np.stack([r["vector"] for r in self._rows]).reshape(-1)
        # A split created before some optional columns has no place for them: its schema decides.
        columns = {f.name: [r[f.name] for r in self._rows] for f in schema if f.name != "vector"}
        arrays = [pa.FixedSizeListArray.from_arrays(pa.array(vectors), self.dim) if f.name == "vector"
                  else pa.array(columns[f.name], type=f.type) for f in schema]
        self._shard.commit(pa.Table.from_arrays(arrays, schema=schema))
        self._rows = []

    def buffered(self) -> int:
        return len(self._rows)


def _count(value, name: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidInputError(f"{name} must be an integer, got {value!r}") from None
    if n < 0:
        raise InvalidInputError(f"{name} must be >= 0, got {n}")
    return n


def _optional_float(value) -> float | None:
    return None if value is None else float(value)
