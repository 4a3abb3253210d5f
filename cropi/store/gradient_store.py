"""The projected-gradient store: one sharded Arrow IPC dataset per (checkpoint, spec, split).

Layout: ``<root>/gradients/<checkpoint name>/<spec_id>/<split>/`` (see sharded.py).
The identity of each split records the checkpoint fingerprint, the projection
spec, the vector length and dtype, and extra settings (loss options, trajectory
set), so gradients computed under other settings are never mixed in.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from cropi.errors import InvalidInputError, MismatchError, NotFoundError
from cropi.store.gradient_table import GradientTable
from cropi.store.gradient_writer import GradientWriter
from cropi.store.key_index import KeyIndex
from cropi.store.part_cache import PartCache
from cropi.store.sharded import ShardedDataset, check_name
from cropi.store.types import (DTYPES, GRADIENT_STATUSES, LEGACY_OPTIONAL_COUNTS, CheckpointRef, GradientRecord,
                               gradient_schema, legacy_schema)
from cropi.utils.fsio import file_exists, resolve

__all__ = ["DTYPES", "GRADIENT_STATUSES", "CheckpointRef", "GradientRecord", "GradientSplit", "GradientStore",
           "GradientWriter", "SplitReader", "gradient_schema"]


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
            # a split created before some optional columns existed: keep filling it without them
            dataset = self._legacy(path, identity, schema, error)
        return GradientSplit(dataset)

    def _legacy(self, path: str, identity: dict, schema, error: MismatchError) -> ShardedDataset:
        for keep in LEGACY_OPTIONAL_COUNTS:
            try:
                return ShardedDataset(path, identity, "ipc", legacy_schema(schema, keep), "prompt_id",
                                      filesystem=self.fs)
            except MismatchError:
                continue
        raise error

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
        return GradientWriter(self.dataset, self.dim, self.dtype, writer_id, rows_per_shard)

    def version(self) -> tuple:
        """Changes whenever a shard is committed: a cache key for readers (the manifest never changes)."""
        return self.dataset.version()

    def committed_prompt_ids(self) -> set[str]:
        return self.dataset.committed_keys()

    def index(self) -> KeyIndex:
        """Where each prompt's gradient lives; reads the shards' keys, no vectors."""
        return self.dataset.key_index()

    def take(self, prompt_ids: list[str], index: KeyIndex | None = None,
             cache: PartCache | None = None) -> GradientTable:
        """The gradients of ``prompt_ids``, in that order, reading and verifying only the record
        batches that hold them (see ``ShardedDataset.take``)."""
        return GradientTable.from_arrow(self.dataset.take(list(prompt_ids), index, cache), self.checkpoint,
                                        self.spec, self.split, self.dim, self.dtype)

    def read(self, verify: bool = True) -> GradientTable:
        """Every committed gradient (first occurrence of each prompt), checksums verified."""
        return GradientTable.from_arrow(self.dataset.read(verify), self.checkpoint, self.spec, self.split,
                                        self.dim, self.dtype)


class SplitReader:
    """A split open for lookups: its key index built once, gradients read a record batch at a time
    through ``cache`` (shared by every reader of a process, so its budget bounds them all)."""

    def __init__(self, split: GradientSplit, cache: PartCache | None = None):
        self.gradients, self.cache = split, cache
        self.index = split.index()
        self.checkpoint, self.spec, self.split = split.checkpoint, split.spec, split.split
        self.dim, self.dtype = split.dim, split.dtype

    @property
    def spec_id(self) -> str:
        return self.spec.get("spec_id", "")

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.index

    def take(self, prompt_ids: list[str]) -> GradientTable:
        return self.gradients.take(prompt_ids, self.index, self.cache)

    def cached(self, prompt_ids: list[str]) -> GradientTable | None:
        """``take(prompt_ids)`` when every record batch needed is in the cache, else None: never reads."""
        table = self.gradients.dataset.take(list(prompt_ids), self.index, self.cache, cached_only=True)
        if table is None:
            return None
        s = self.gradients
        return GradientTable.from_arrow(table, s.checkpoint, s.spec, s.split, s.dim, s.dtype)
