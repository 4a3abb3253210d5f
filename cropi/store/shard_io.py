"""Shard files and commit files of a sharded dataset: write, list, verify, load.

A shard is read whole into memory this process owns, and those very bytes are
checked against the size and sha256 its commit recorded before they are parsed.
Nothing is memory-mapped: a file edited or truncated in place after a read can
neither change a table already handed out nor crash the reader (SIGBUS), and
every read that loads bytes from disk verifies them (no "verified before" cache
that a same-size, same-mtime edit could slip past).
"""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cropi.errors import CorruptDataError
from cropi.utils.fsio import TMP_MARK, atomic_write_bytes, read_json, sha256_bytes, write_json_atomic

EXTENSIONS = {"ipc": "arrow", "parquet": "parquet"}
_ENTRY_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*-\d{6,}\.(arrow|parquet)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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
    problem = "has no shard list" if not isinstance(entries, list) else next(
        (f"shard entry {i}: {p}" for i, e in enumerate(entries) if (p := entry_problem(e, writer_id))), None)
    if problem:
        raise CorruptDataError(f"{path} is not a valid commit file ({problem}); restore it, or delete it and "
                               f"the shards/{writer_id}-* files and rerun writer {writer_id}")
    return entries


def entry_problem(entry, writer_id: str) -> str | None:
    """What is wrong with one commit entry's fields, or None (the shard itself is checked on load)."""
    if not isinstance(entry, dict):
        return "not an object"
    missing = {"file", "rows", "bytes", "sha256", "first_key", "last_key"} - set(entry)
    if missing:
        return f"missing {sorted(missing)}"
    file, first, last = entry["file"], entry["first_key"], entry["last_key"]
    if not isinstance(file, str) or not _ENTRY_FILE.match(file) or not file.startswith(f"{writer_id}-"):
        return f"file {file!r} is not one of writer {writer_id}'s shard names"
    for name in ("rows", "bytes"):
        n = entry[name]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return f"{name} {n!r} is not a positive integer"
    if not isinstance(entry["sha256"], str) or not _SHA256.match(entry["sha256"]):
        return f"sha256 {entry['sha256']!r} is not a hex sha256"
    if not isinstance(first, str) or not isinstance(last, str) or first > last:
        return f"key range {first!r}..{last!r} is not an ordered pair of strings"
    return None


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


def read_verified(fs: pafs.FileSystem, base: str, writer_id: str, entry: dict) -> pa.Buffer:
    """The bytes of a committed shard, read once into owned memory and checked against its commit entry.

    The checked bytes are the parsed bytes, so a file changed between a check and
    a read cannot slip through.
    """
    path = shard_path(base, entry["file"])
    try:
        with fs.open_input_stream(path) as f:
            data = f.read_buffer()
    except FileNotFoundError as e:
        raise _corrupt(base, writer_id, entry, "is missing") from e
    except OSError as e:
        raise _corrupt(base, writer_id, entry, f"cannot be read ({e})") from e
    if data.size != entry["bytes"]:
        raise _corrupt(base, writer_id, entry, f"has {data.size} bytes, committed {entry['bytes']}")
    got = hashlib.sha256(memoryview(data)).hexdigest()
    if got != entry["sha256"]:
        raise _corrupt(base, writer_id, entry, f"fails its checksum (sha256 {got[:12]}..., committed "
                                               f"{entry['sha256'][:12]}...): it was changed after it was written")
    return data


def load_shard(fs: pafs.FileSystem, base: str, writer_id: str, entry: dict, fmt: str, key: str,
               columns: list[str] | None = None) -> pa.Table:
    """A committed shard as a table over owned, verified memory; its rows and key range checked too."""
    data = read_verified(fs, base, writer_id, entry)
    try:
        if fmt == "ipc":
            table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        else:
            table = pq.read_table(pa.BufferReader(data), columns=None if columns is None else
                                  sorted(set(columns) | {key}))
    except (pa.ArrowInvalid, OSError) as e:
        raise _corrupt(base, writer_id, entry, f"cannot be parsed ({e})") from e
    if table.num_rows != entry["rows"]:
        raise _corrupt(base, writer_id, entry, f"has {table.num_rows} rows, committed {entry['rows']}")
    keys = table.column(key) if key in table.column_names else None
    if keys is None or keys.null_count or not pa.types.is_string(keys.type):
        raise _corrupt(base, writer_id, entry, f"has no string key column {key!r}")
    lo, hi = pc.min_max(keys).values()
    if (lo.as_py(), hi.as_py()) != (entry["first_key"], entry["last_key"]):
        raise CorruptDataError(f"{commit_path(base, writer_id)} records keys {entry['first_key']!r}.."
                               f"{entry['last_key']!r} for shard {entry['file']}, which holds {lo.as_py()!r}.."
                               f"{hi.as_py()!r}: the commit file was changed. Restore it, or remove that entry "
                               f"and rerun writer {writer_id} to recompute those rows")
    return table.select(columns) if columns else table
