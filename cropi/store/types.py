"""The store's value types: what callers hand the store and get back, apart from the
classes that read and write (so the writer, the table and the facade import these, and
none of them imports another for a type)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from cropi.contracts import GRADIENT_OPTIONAL_COLUMNS, GRADIENT_STATUSES, VECTOR_DTYPES
from cropi.errors import InvalidInputError

DTYPES = VECTOR_DTYPES
__all__ = ["DTYPES", "GRADIENT_STATUSES", "CheckpointRef", "GradientRecord", "gradient_schema", "legacy_schema"]


class CheckpointRef(BaseModel):
    """A checkpoint by name (its directory in the store) and content fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    fingerprint: str


@dataclass
class GradientRecord:
    """One prompt's projected POPI gradient and its metadata: one row of a gradient split.

    The computer makes it, the writer stores it; the field names are the columns of
    ``gradient_schema`` (``contracts.GRADIENT_META_COLUMNS`` after ``prompt_id`` and ``vector``).
    """

    prompt_id: str
    vector: np.ndarray  # (dim,), float32 from the computer; stored as the split's dtype
    raw_norm: float
    n_responses: int
    reward_mean: float
    reward_std: float
    n_tokens: int
    status: str
    # Effective sample size of the responses' sequence-level importance weights pi_theta/beta,
    # and the same over K (docs/architecture.md, "ESS and refresh"); None when not computed.
    ess: float | None = None
    ess_fraction: float | None = None


def gradient_schema(dim: int, dtype: str = "float16") -> pa.Schema:
    """Schema of a projected-gradient shard with ``dim``-long vectors of ``dtype``."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise InvalidInputError(f"vector dim must be a positive integer, got {dim!r}")
    if dtype not in DTYPES:
        raise InvalidInputError(f"vector dtype {dtype!r} is not one of {DTYPES}")
    return pa.schema([
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("vector", pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), int(dim)), nullable=False),
        pa.field("raw_norm", pa.float64(), nullable=False),
        pa.field("n_responses", pa.int32(), nullable=False),
        pa.field("reward_mean", pa.float64(), nullable=False),
        pa.field("reward_std", pa.float64(), nullable=False),
        pa.field("n_tokens", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        *(pa.field(name, pa.float64(), nullable=True) for name in GRADIENT_OPTIONAL_COLUMNS),
    ])


def legacy_schema(schema: pa.Schema) -> pa.Schema:
    """The schema splits had before the optional (ESS) columns: such splits still open, read and resume."""
    for name in GRADIENT_OPTIONAL_COLUMNS:
        schema = schema.remove(schema.get_field_index(name))
    return schema
