"""The projected-gradient store: one sharded Arrow IPC dataset per (checkpoint, spec, split).

Layout: ``<root>/gradients/<checkpoint name>/<spec_id>/<split>/`` (see sharded.py).
The identity of each split records the checkpoint fingerprint, the projection
spec, the vector length and dtype, and extra settings (loss options, trajectory
set), so gradients computed under other settings are never mixed in.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict

from cropi.errors import InvalidInputError, MismatchError, NotFoundError
from cropi.store.gradient_table import GRADIENT_STATUSES, GradientTable
from cropi.store.gradient_writer import GradientWriter
from cropi.store.sharded import ShardedDataset, check_name
from cropi.utils.fsio import file_exists, resolve

DTYPES = ("float16", "float32")
__all__ = ["GRADIENT_STATUSES", "CheckpointRef", "GradientSplit", "GradientStore", "GradientWriter",
           "gradient_schema"]


class CheckpointRef(BaseModel):
    """A checkpoint by name (its directory in the store) and content fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    fingerprint: str


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
        *ESS_FIELDS,
    ])


# Effective sample size of each prompt's importance weights at the scored checkpoint, and
# the same over K (METHOD.md, off-policy diagnostics); null where it was not computed.
ESS_FIELDS = (pa.field("ess", pa.float64(), nullable=True), pa.field("ess_fraction", pa.float64(), nullable=True))


def _legacy_schema(schema: pa.Schema) -> pa.Schema:
    """The schema splits had before the ESS columns: such splits still open, read and resume."""
    for f in ESS_FIELDS:
        schema = schema.remove(schema.get_field_index(f.name))
    return schema


class GradientStore:
    """All projected gradients under one root (a local path or a pyarrow URI)."""

    def __init__(self, root: str):
        self.root = str(root)
        self.fs, self.path = resolve(root)

    def _dir(self, checkpoint_name: str, spec_id: str, split: str) -> str:
        parts = (check_name(checkpoint_name, "checkpoint name"), check_name(spec_id, "spec_id"),
                 check_name(split, "split name"))
        return "/".join((self.path, "gradients") + parts)

    def split(self, checkpoint: CheckpointRef, spec: dict, split: str, *, dim: int,
              dtype: str = "float16", extra: dict | None = None) -> "GradientSplit":
        """Create, or reopen with the same identity, the gradients of ``split``."""
        if not isinstance(checkpoint, CheckpointRef):
            raise InvalidInputError(f"checkpoint must be a CheckpointRef, got {type(checkpoint).__name__}")
        if not isinstance(spec, dict) or not isinstance(spec.get("spec_id"), str):
            raise InvalidInputError("spec must be a dict with the projection spec's spec_id under 'spec_id'")
        schema = gradient_schema(dim, dtype)
        identity = {"kind": "gradients", "checkpoint": checkpoint.model_dump(), "spec": spec, "split": split,
                    "dim": int(dim), "dtype": dtype, "extra": extra or {}}
        path = self._dir(checkpoint.name, spec["spec_id"], split)
        try:
            dataset = ShardedDataset(path, identity, "ipc", schema, "prompt_id", filesystem=self.fs)
        except MismatchError as error:
            try:  # a split created before the ESS columns existed: keep filling it without them
                dataset = ShardedDataset(path, identity, "ipc", _legacy_schema(schema), "prompt_id",
                                         filesystem=self.fs)
            except MismatchError:
                raise error from None
        return GradientSplit(dataset)

    def open_split(self, checkpoint_name: str, spec_id: str, split: str) -> "GradientSplit":
        """An existing split; NotFoundError listing the splits that do exist."""
        path = self._dir(checkpoint_name, spec_id, split)
        if not file_exists(self.fs, f"{path}/manifest.json"):
            present = [f"{s['checkpoint']}/{s['spec_id']}/{s['split']}" for s in self.list_splits()]
            raise NotFoundError(f"no gradients for checkpoint {checkpoint_name!r}, spec {spec_id!r}, split "
                                f"{split!r} in {self.root}; present: {present[:20] or 'none'}")
        return GradientSplit(ShardedDataset(path, filesystem=self.fs))

    def list_splits(self) -> list[dict]:
        """Every stored split: checkpoint, spec_id, split, rows (committed), dim, dtype."""
        out = []
        top = f"{self.path}/gradients"
        for ckpt in self._subdirs(top):
            for spec_id in self._subdirs(f"{top}/{ckpt}"):
                for split in self._subdirs(f"{top}/{ckpt}/{spec_id}"):
                    if file_exists(self.fs, f"{top}/{ckpt}/{spec_id}/{split}/manifest.json"):
                        s = self.open_split(ckpt, spec_id, split)
                        out.append({"checkpoint": ckpt, "spec_id": spec_id, "split": split,
                                    "rows": s.dataset.stats()["rows"], "dim": s.dim, "dtype": s.dtype})
        return out

    def _subdirs(self, path: str) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


class GradientSplit:
    """The projected gradients of one split at one checkpoint under one projection spec."""

    def __init__(self, dataset: ShardedDataset):
        identity = dataset.identity
        if identity.get("kind") != "gradients":
            raise MismatchError(f"{dataset.path} holds {identity.get('kind')!r} data, not gradients")
        self.dataset = dataset
        self.checkpoint = CheckpointRef(**identity["checkpoint"])
        self.spec: dict = identity["spec"]
        self.split: str = identity["split"]
        self.dim: int = identity["dim"]
        self.dtype: str = identity["dtype"]
        self.extra: dict = identity["extra"]

    @property
    def identity(self) -> dict:
        return self.dataset.identity

    def writer(self, writer_id: str, rows_per_shard: int = 64) -> GradientWriter:
        return GradientWriter(self, writer_id, rows_per_shard)

    def version(self) -> tuple:
        """Changes whenever a shard is committed: a cache key for readers (the manifest never changes)."""
        return self.dataset.version()

    def committed_prompt_ids(self) -> set[str]:
        return self.dataset.committed_keys()

    def read(self, verify: bool = True) -> GradientTable:
        """Every committed gradient (first occurrence of each prompt), checksums verified."""
        return GradientTable.from_arrow(self.dataset.read(verify), self.checkpoint, self.spec, self.split,
                                        self.dim, self.dtype)
