"""A dataset of immutable shards that many writers fill without locks.

Layout under the dataset directory::

    manifest.json               identity, format, key column, schema (written once)
    commits/<writer_id>.json    the shards that writer committed, with row counts and sha256
    shards/<writer_id>-<seq>.<arrow|parquet>

Each writer rewrites only its own commit file, atomically, so workers on a
shared filesystem never contend. A shard becomes visible when its writer's
commit file lists it; a file no commit lists is a killed run's leftover and is
deleted when that writer reopens. Reads go writer by writer (sorted by id), shard
by shard, and keep the first occurrence of each key. Every shard read is checked
against its commit entry (size, sha256, rows, key range; see shard_io).

A lookup of a few keys (``take``) reads only the parts that hold them, each verified
against its own checksum, through a ``KeyIndex`` built from the shards' keys sidecars
and an optional ``PartCache`` of verified parts.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from typing import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from cropi.errors import CorruptDataError, InvalidInputError, NotFoundError, StorageFullError
from cropi.store import manifest as mf
from cropi.store import shard_io
from cropi.store.lease import WriterLease
from cropi.store.key_index import KeyIndex, Part
from cropi.store.part_cache import PartCache
from cropi.store.schema import check_table, conform
from cropi.utils.fsio import resolve

log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def check_name(value: str, what: str) -> str:
    """A name used as a file or directory name: letters, digits, ``_ . -``."""
    if not isinstance(value, str) or not _NAME.match(value) or value in {".", ".."}:
        raise InvalidInputError(f"{what} {value!r} must be 1-128 letters, digits, '_', '.' or '-' "
                                "(not starting with '.' or '-')")
    return value


class ShardedDataset:
    """Create (``identity`` given) or open (``identity=None``) a sharded dataset at ``root_uri``."""

    def __init__(self, root_uri: str, identity: dict | None = None, fmt: str = "ipc",
                 schema: pa.Schema | None = None, key: str = "prompt_id", *,
                 filesystem: pafs.FileSystem | None = None):
        """``filesystem`` given: ``root_uri`` is a path on it, not resolved again."""
        self.root_uri = root_uri
        self.fs, self.path = (filesystem, str(root_uri).rstrip("/")) if filesystem else resolve(root_uri)
        if identity is None:
            self.manifest = mf.read_manifest(self.fs, self.path)
        else:
            self.manifest = mf.create_or_check(self.fs, self.path, _new_manifest(identity, fmt, schema, key))
        self.fmt: str = self.manifest["format"]
        self.key: str = self.manifest["key"]
        self.schema: pa.Schema = mf.manifest_schema(self.manifest, self.path)

    @property
    def exists(self) -> bool:
        return self.fs.get_file_info(f"{self.path}/{mf.MANIFEST}").type == pafs.FileType.File

    @property
    def identity(self) -> dict:
        return self.manifest["identity"]

    def writer(self, writer_id: str) -> "ShardWriter":
        """The writer ``writer_id``, once no other process holds it (cropi.store.lease); clears its leftovers.
        Read what it has committed after this returns: another holder may have committed meanwhile."""
        return ShardWriter(self, check_name(writer_id, "writer id"))

    def commits(self) -> dict[str, list[dict]]:
        """Committed shard entries per writer, writers sorted by id."""
        return {w: shard_io.read_commit(self.fs, self.path, w) for w in shard_io.writer_ids(self.fs, self.path)}

    def stats(self) -> dict:
        """Committed rows (before de-duplication across writers), shards and writers."""
        commits = self.commits()
        return {"rows": sum(e["rows"] for es in commits.values() for e in es),
                "shards": sum(len(es) for es in commits.values()), "writers": len(commits)}

    def version(self) -> tuple:
        """A cheap stamp that changes whenever any writer commits (commit files' names, sizes, mtimes)."""
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.path}/commits", allow_not_found=True))
        return tuple(sorted((i.base_name, i.size, i.mtime_ns) for i in infos
                            if i.type == pafs.FileType.File and i.base_name.endswith(".json")))

    def committed_keys(self) -> set[str]:
        """Every key some writer committed (the union over writers)."""
        out: set[str] = set()
        for w, entries in self.commits().items():
            for e in entries:
                out.update(self.shard_keys(w, e))
        return out

    def shard_keys(self, writer_id: str, entry: dict) -> list[str]:
        """One shard's keys in row order: from its verified sidecar, or (older shards) its verified file."""
        if "keys" in entry:
            return shard_io.read_keys(self.fs, self.path, writer_id, entry)
        return self._load(writer_id, entry, columns=[self.key]).column(0).to_pylist()

    def key_index(self) -> KeyIndex:
        """Where every key lives (first occurrence wins); reads the keys sidecars, no vectors."""
        index = KeyIndex()
        for w, entries in self.commits().items():
            for e in entries:
                index.add(w, e, self.shard_keys(w, e))
        return index.finish()

    def take(self, keys: list[str], index: KeyIndex | None = None, cache: PartCache | None = None, *,
             cached_only: bool = False) -> pa.Table | None:
        """The rows of ``keys``, in that order, reading and verifying only the parts that hold them.

        NotFoundError names keys the dataset does not hold. ``index`` (from ``key_index``) and
        ``cache`` are the caller's to keep between calls; without them each call builds its own.
        ``cached_only``: None unless every part needed is in ``cache`` (no I/O at all).
        """
        index = index if index is not None else self.key_index()
        places = [index.locate(k) for k in keys]
        missing = [k for k, p in zip(keys, places) if p is None]
        if missing:
            raise NotFoundError(f"{len(missing)} of {len(keys)} keys are not in {self.path}: {missing[:5]}")
        wanted = sorted({p for p, _ in places})
        if cached_only:
            found = {p: cache.peek((self.path, *index.parts[p].key)) for p in wanted} if cache else {}
            if not found or any(v is None for v in found.values()):
                return None
        rows_of: dict[int, list[int]] = {}
        for p, r in places:
            rows_of.setdefault(p, []).append(r)
        pieces, at = [], {}
        for p in wanted:  # one part held at a time: only the asked rows are kept from each
            rows = sorted(set(rows_of[p]))
            at |= {(p, r): len(at) + i for i, r in enumerate(rows)}
            pieces.append(self._part(index.parts[p], cache).take(pa.array(rows, pa.int64())))
        table = pa.Table.from_batches(pieces, schema=self.schema) if pieces else self.schema.empty_table()
        out = table.take(pa.array([at[pr] for pr in places], pa.int64()))
        if out.column(self.key).to_pylist() != list(keys):
            raise CorruptDataError(f"the keys index of {self.path} does not match its verified shards (a commit "
                                   "file was changed after its shards were written); restore it, or remove "
                                   "the changed entries and rerun their writers")
        return out

    def _part(self, part: Part, cache: PartCache | None) -> pa.RecordBatch:
        def load() -> pa.RecordBatch:
            if part.batch is None:
                return self._load(part.writer, part.entry).combine_chunks().to_batches()[0]
            batch = shard_io.read_part(self.fs, self.path, part.writer, part.entry, part.batch, self.schema)
            return pa.record_batch(batch.columns, schema=self.schema)
        if cache is None:
            return load()
        return cache.get((self.path, *part.key), part.nbytes, load)

    def iter_shards(self, verify: bool = True, keys: set[str] | None = None) -> Iterator[pa.Table]:
        """Committed shards in (writer_id, seq) order, each without keys seen before.

        With ``keys``, only rows of those keys, and shards whose key range cannot
        hold any of them are not read at all. Checksums are always verified
        (``verify`` is accepted for older callers and changes nothing).
        """
        seen: set[str] = set()
        lo, hi = (min(keys), max(keys)) if keys else (None, None)
        for w, entries in self.commits().items():
            for e in entries:
                if keys is not None and (not keys or e["last_key"] < lo or e["first_key"] > hi):
                    continue
                table = self._load(w, e)
                table, seen = _first_occurrences(table, self.key, seen, keys)
                if table.num_rows:
                    yield table

    def read(self, verify: bool = True) -> pa.Table:
        """All committed rows, de-duplicated by key (first occurrence wins), checksums verified."""
        tables = list(self.iter_shards(verify))
        return pa.concat_tables(tables) if tables else self.schema.empty_table()

    def _load(self, writer_id: str, entry: dict, columns: list[str] | None = None) -> pa.Table:
        table = shard_io.load_shard(self.fs, self.path, writer_id, entry, self.fmt, self.key, columns)
        schema = self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
        try:
            return conform(table, schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as e:
            raise CorruptDataError(f"shard {entry['file']} of {self.path} does not have the dataset "
                                   f"schema ({e}); remove its entry from commits/{writer_id}.json and "
                                   "rerun that writer") from e


def _new_manifest(identity: dict, fmt: str, schema: pa.Schema | None, key: str) -> dict:
    if fmt not in shard_io.EXTENSIONS:
        raise InvalidInputError(f"format {fmt!r} is not one of {sorted(shard_io.EXTENSIONS)}")
    if not isinstance(schema, pa.Schema):
        raise InvalidInputError("creating a dataset needs its pyarrow schema")
    if schema.get_field_index(key) < 0 or not pa.types.is_string(schema.field(key).type):
        raise InvalidInputError(f"key column {key!r} must be a string column of the schema {schema.names}")
    return mf.make_manifest(identity, fmt, key, schema)


def _first_occurrences(table: pa.Table, key: str, seen: set[str], keys: set[str] | None):
    """Rows of ``table`` whose key is wanted and was not seen in an earlier shard."""
    values = table.column(key).to_pylist()
    drop = set(values) & seen
    if keys is not None:
        drop |= set(values) - keys
    seen = seen | (set(values) - drop)
    if drop:
        table = table.filter(pa.array([v not in drop for v in values]))
    return table, seen


class ShardWriter:
    """Commits tables as shards of one dataset under one writer id."""

    def __init__(self, dataset: ShardedDataset, writer_id: str):
        self.dataset = dataset
        self.writer_id = writer_id
        fs, base = dataset.fs, dataset.path
        # waits while another process writes under this id: its leftovers are cleared just below
        self._lease = WriterLease(fs, base, writer_id)
        try:
            self.entries = shard_io.read_commit(fs, base, writer_id)
            self._seq = shard_io.remove_orphans(fs, base, writer_id, dataset.fmt, self.entries)
        except BaseException:
            self._lease.release()
            raise
        self._keys: set[str] | None = None

    def release(self) -> None:
        """Let another process write under this id (the writer commits nothing more)."""
        self._lease.release()

    def committed_keys(self) -> set[str]:
        """Keys this writer has committed (read once from its shards' keys, then kept up to date)."""
        if self._keys is None:
            self._keys = {k for e in self.entries for k in self.dataset.shard_keys(self.writer_id, e)}
        return self._keys

    def commit(self, table: pa.Table) -> None:
        """Write ``table`` as one shard and list it in this writer's commit file."""
        ds = self.dataset
        table = check_table(table, ds.schema)
        if table.num_rows == 0:
            return
        keys = table.column(ds.key).to_pylist()
        dup = set(keys) & self.committed_keys()
        if dup:
            raise InvalidInputError(f"writer {self.writer_id} already committed {len(dup)} of these keys "
                                    f"(e.g. {sorted(dup)[:3]}); skip committed keys before computing them")
        entry = shard_io.write_shard(ds.fs, ds.path, self.writer_id, self._seq, ds.fmt, table, keys)
        self._write_commit(self.entries + [entry])  # the commit point: the shard is now visible
        self.entries.append(entry)
        self._seq += 1
        self._keys.update(keys)

    def _write_commit(self, entries: list[dict]) -> None:
        shard_io.write_commit(self.dataset.fs, self.dataset.path, self.writer_id, entries)


class BufferedWriter(ABC):
    """What every buffering writer of a dataset shares: ``flush`` commits the buffer as one shard (the subclass's);
    ``close`` flushes and releases the writer id; as a context manager it closes on the way out, and where the
    caller failed it still commits the buffer (complete results), logging a commit that fails then instead of
    raising over the caller's error."""

    what = "rows"  # what the buffer holds, for the messages

    def __init__(self, shard: ShardWriter):
        self._shard = shard
        self._closed = False

    @abstractmethod
    def flush(self) -> None:
        """Commit the buffer as one shard (nothing when it is empty)."""

    @abstractmethod
    def buffered(self) -> int:
        """How many items wait in the buffer."""

    def close(self) -> None:
        if not self._closed:
            try:
                self.flush()
            finally:
                self._closed = True
                self._shard.release()  # another process may write under this id now

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # buffered items are complete results: keep them even when the caller failed
            self.close()
        except StorageFullError as e:  # the caller's own error is most likely this one: said once, no traceback
            log.warning("could not commit %d buffered %s: %s", self.buffered(), self.what, e)
        except Exception:
            log.exception("could not commit buffered %s while handling another error", self.what)
