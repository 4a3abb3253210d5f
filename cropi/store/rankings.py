"""Rankings on disk: a Parquet file (meta in its schema metadata) and a small checksum file beside it.

Layout under a store: ``rankings/<checkpoint>/<spec_id>/<pool>.parquet`` and
``<pool>.parquet.sha256.json``, which lists the sha256 and size a reader accepts.
A ranking is written in three atomic steps, so a crash at any point leaves a pair
that loads (the old ranking or the new one):

1. the checksum file accepts both the ranking now on disk and the new one;
2. the new Parquet file replaces the old;
3. the checksum file accepts only the new one.

A load reads the file once into memory, checks those bytes, then parses them: a
truncated or bit-flipped ranking is refused with an error naming the file, never
served with changed prompt ids, scores or ranks.
"""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cropi.errors import CorruptDataError, InvalidInputError, NotFoundError
from cropi.utils.fsio import atomic_write_bytes, file_exists, parent, read_json, resolve, write_json_atomic

META_KEY = b"cropi.ranking"
CHECKSUM_SUFFIX = ".sha256.json"
_RERUN = "rerun `cropi rank` (or the scoring job) for this checkpoint to write it again"


def ranking_file(store: str, name: str, spec_id: str, pool: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of the ranking of ``pool`` at checkpoint ``name`` under ``spec_id``."""
    fs, base = resolve(store)
    return fs, f"{base}/rankings/{name}/{spec_id}/{pool}.parquet"


def checksum_path(path: str) -> str:
    return path + CHECKSUM_SUFFIX


def save(store: str, name: str, spec_id: str, pool: str, table: pa.Table, meta: dict) -> None:
    """Persist a ranking table with its meta (see the module docstring for the write order)."""
    fs, path = ranking_file(store, name, spec_id, pool)
    write_ranking(fs, path, table, meta)


def write_ranking(fs: pafs.FileSystem, path: str, table: pa.Table, meta: dict) -> None:
    try:
        meta_bytes = json.dumps(meta, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"ranking meta for {path} is not plain JSON ({e})") from e
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata({META_KEY: meta_bytes}), sink)
    data = sink.getvalue()
    new = _stamp(data)
    current = _current_stamp(fs, path)
    fs.create_dir(parent(path), recursive=True)
    write_json_atomic(fs, checksum_path(path), {"accept": [new] + ([current] if current and current != new else [])})
    atomic_write_bytes(fs, path, data.to_pybytes())
    write_json_atomic(fs, checksum_path(path), {"accept": [new]})


def _stamp(data) -> dict:
    return {"sha256": hashlib.sha256(memoryview(data)).hexdigest(), "bytes": len(data)}


def _current_stamp(fs: pafs.FileSystem, path: str) -> dict | None:
    """The stamp of the ranking on disk now, if its checksum file accepts it (a reader may be using it)."""
    try:
        return _stamp(_read_checked(fs, path)[0])
    except (CorruptDataError, NotFoundError):
        return None


def load(store: str, name: str, *, pool: str | None = None, spec_id: str | None = None) -> tuple[pa.Table, dict]:
    """The one stored ranking of checkpoint ``name`` (narrowed by ``pool``/``spec_id``): (table, meta)."""
    fs, base = resolve(store)
    root = f"{base}/rankings/{name}"
    files = [f.path for f in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
             if f.type == pafs.FileType.File and f.path.endswith(".parquet")]
    files = [f for f in files if (spec_id is None or f"/{spec_id}/" in f)
             and (pool is None or f.endswith(f"/{pool}.parquet"))]
    if not files:
        raise NotFoundError(f"no stored ranking for checkpoint {name!r}" + (f", pool {pool!r}" if pool else "")
                            + ": run `cropi rank` (or wait for the scoring job) first")
    if len(files) > 1:
        raise InvalidInputError(f"several rankings for {name!r}: {sorted(files)}; name the pool and spec")
    return read_ranking(fs, files[0])


def read_ranking(fs: pafs.FileSystem, path: str) -> tuple[pa.Table, dict]:
    """A ranking file's table (without schema metadata) and meta, its bytes checked first."""
    data, _ = _read_checked(fs, path)
    try:
        table = pq.read_table(pa.BufferReader(data))
        meta = json.loads((table.schema.metadata or {})[META_KEY])
    except (pa.ArrowException, OSError, KeyError, ValueError) as e:
        # the checksum matched, so the file is as written: written by something other than cropi
        raise CorruptDataError(f"ranking {path} is not a cropi ranking ({e}); {_RERUN}") from e
    if not isinstance(meta, dict):
        raise CorruptDataError(f"ranking {path} has no meta object; {_RERUN}")
    return table.replace_schema_metadata(None), meta


def _read_checked(fs: pafs.FileSystem, path: str) -> tuple[pa.Buffer, dict]:
    """The bytes of ``path``, read once, with the checksum-file entry they match."""
    sums = checksum_path(path)
    try:
        with fs.open_input_stream(path) as f:
            data = f.read_buffer()
    except FileNotFoundError as e:
        raise NotFoundError(f"ranking {path} does not exist; {_RERUN}") from e
    if not file_exists(fs, sums):
        raise CorruptDataError(f"ranking {path} has no checksum file {sums} (written by an older cropi, or "
                               f"the file was removed), so it cannot be trusted; {_RERUN}")
    doc = read_json(fs, sums)
    accept = doc.get("accept") if isinstance(doc, dict) else None
    if not isinstance(accept, list) or not all(isinstance(a, dict) for a in accept):
        raise CorruptDataError(f"checksum file {sums} of ranking {path} is damaged; {_RERUN}")
    got = _stamp(data)
    for entry in accept:
        if entry == got:
            return data, entry
    sizes = sorted({a.get("bytes") for a in accept}, key=str)
    why = (f"has {got['bytes']} bytes, its checksum file records {sizes}" if got["bytes"] not in sizes
           else f"fails its checksum (sha256 {got['sha256'][:12]}...)")
    raise CorruptDataError(f"ranking {path} {why}: it was changed after it was written; {_RERUN}")
