"""Shard files and commit files of a sharded dataset: write, list, verify, load.

Verified checksums are remembered per process, keyed by (path, size, mtime), so
reading a dataset again does not hash its shards again.
"""

from __future__ import annotations

import re
import threading

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cropi.errors import CorruptDataError
from cropi.utils.fsio import (TMP_MARK, atomic_write_bytes, is_local, read_json, sha256_bytes,
                              sha256_file, write_json_atomic)

EXTENSIONS = {"ipc": "arrow", "parquet": "parquet"}
_verified: dict[tuple, str] = {}
_verified_lock = threading.Lock()


def commit_path(base: str, writer_id: str) -> str:
    return f"{base}/commits/{writer_id}.json"


def shard_path(base: str, file: str) -> str:
    return f"{base}/shards/{file}"


def _names(fs: pafs.FileSystem, folder: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)


def writer_ids(fs: pafs.FileSystem, base: str) -> list[str]:
    """Writers with a commit file, sorted (temporary files end in .tmp-<uuid> and are skipped)."""
    return [n[: -len(".json")] for n in _names(fs, f"{base}/commits") if n.endswith(".json")]


def read_commit(fs: pafs.FileSystem, base: str, writer_id: str) -> list[dict]:
    """The shard entries ``writer_id`` committed, in commit order; [] if it has none."""
    path = commit_path(base, writer_id)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return []
    doc = read_json(fs, path)
    entries = doc.get("shards") if isinstance(doc, dict) else None
    need = {"file", "rows", "bytes", "sha256", "first_key", "last_key"}
    if not isinstance(entries, list) or not all(isinstance(e, dict) and need <= set(e) for e in entries):
        raise CorruptDataError(f"{path} is not a valid commit file; restore it, or delete it and the "
                               f"shards/{writer_id}-* files and rerun writer {writer_id}")
    return entries


def write_commit(fs: pafs.FileSystem, base: str, writer_id: str, entries: list[dict]) -> None:
    write_json_atomic(fs, commit_path(base, writer_id), {"writer_id": writer_id, "shards": entries})


def remove_orphans(fs: pafs.FileSystem, base: str, writer_id: str, fmt: str, entries: list[dict]) -> int:
    """Delete this writer's shard and temporary files no commit lists; return the next sequence number."""
    pattern = re.compile(rf"^{re.escape(writer_id)}-(\d{{6,}})\.{EXTENSIONS[fmt]}"
                         rf"({re.escape(TMP_MARK)}[0-9a-f]+)?$")
    listed = {e["file"] for e in entries}
    seqs = [-1]
    for name in _names(fs, f"{base}/shards"):
        m = pattern.match(name)
        if m:
            seqs.append(int(m.group(1)))  # never reuse a number, not even an orphan's
            if name not in listed:
                fs.delete_file(shard_path(base, name))
    own_tmp = f"{writer_id}.json{TMP_MARK}"
    for name in _names(fs, f"{base}/commits"):
        if name.startswith(own_tmp):
            fs.delete_file(f"{base}/commits/{name}")
    return max(seqs) + 1


def serialize(table: pa.Table, fmt: str) -> bytes:
    sink = pa.BufferOutputStream()
    if fmt == "ipc":
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    else:
        pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def write_shard(fs: pafs.FileSystem, base: str, writer_id: str, seq: int, fmt: str,
                table: pa.Table, keys: list[str]) -> dict:
    """Write one shard file atomically; return its commit entry."""
    data = serialize(table, fmt)
    file = f"{writer_id}-{seq:06d}.{EXTENSIONS[fmt]}"
    atomic_write_bytes(fs, shard_path(base, file), data)
    # first_key/last_key are the smallest and largest key: lets readers skip shards.
    return {"file": file, "rows": table.num_rows, "bytes": len(data), "sha256": sha256_bytes(data),
            "first_key": min(keys), "last_key": max(keys)}


def _corrupt(base: str, writer_id: str, entry: dict, why: str) -> CorruptDataError:
    return CorruptDataError(f"shard {shard_path(base, entry['file'])} {why}. Remove its entry from "
                            f"{commit_path(base, writer_id)} (the writer deletes the file when it next "
                            f"opens) and rerun writer {writer_id} to recompute those rows")


def verify_shard(fs: pafs.FileSystem, base: str, writer_id: str, entry: dict) -> None:
    """Check size and sha256 of a committed shard (hash skipped if verified before, unchanged)."""
    path = shard_path(base, entry["file"])
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        raise _corrupt(base, writer_id, entry, "is missing")
    if info.size != entry["bytes"]:
        raise _corrupt(base, writer_id, entry, f"has {info.size} bytes, committed {entry['bytes']}")
    stamp = (fs.type_name, path, info.size, info.mtime_ns)
    with _verified_lock:
        if _verified.get(stamp) == entry["sha256"]:
            return
    got = sha256_file(fs, path)
    if got != entry["sha256"]:
        raise _corrupt(base, writer_id, entry, f"fails its checksum (sha256 {got[:12]}..., committed "
                                               f"{entry['sha256'][:12]}...)")
    with _verified_lock:
        _verified[stamp] = got


def load_shard(fs: pafs.FileSystem, base: str, writer_id: str, entry: dict, fmt: str, verify: bool,
               columns: list[str] | None = None) -> pa.Table:
    """Read a committed shard: local IPC memory-mapped (zero-copy), others read in full."""
    if verify:
        verify_shard(fs, base, writer_id, entry)
    path = shard_path(base, entry["file"])
    try:
        if fmt == "ipc" and is_local(fs):
            table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        elif fmt == "ipc":
            with fs.open_input_file(path) as f:
                table = pa.ipc.open_file(f).read_all()
        else:
            with fs.open_input_file(path) as f:
                table = pq.read_table(f, columns=columns)
    except FileNotFoundError as e:
        raise _corrupt(base, writer_id, entry, "is missing") from e
    except (pa.ArrowInvalid, OSError) as e:
        raise _corrupt(base, writer_id, entry, f"cannot be read ({e})") from e
    if table.num_rows != entry["rows"]:
        raise _corrupt(base, writer_id, entry, f"has {table.num_rows} rows, committed {entry['rows']}")
    return table.select(columns) if columns and fmt == "ipc" else table
