"""Shard files and commit files of a sharded dataset: write, list, verify, load.

A shard is read into memory this process owns, and those very bytes are checked
against the size and sha256 its commit recorded before they are parsed. Nothing is
memory-mapped: a file edited or truncated in place after a read can neither change
a table already handed out nor crash the reader (SIGBUS), and every read that loads
bytes from disk verifies them (no "verified before" cache that a same-size,
same-mtime edit could slip past).

An Arrow IPC shard is written as record batches of about ``PART_BYTES`` each, and its
commit entry records, besides the whole file's sha256, each batch's place and sha256
(``batches``: ``[offset, bytes, rows, sha256]`` lists) and the sha256 of a sidecar
``<shard>.keys`` holding its keys in row order (``keys``: ``[bytes, sha256]``). A lookup
then reads and verifies only the batches that hold the asked rows (``read_part``), and
an index of keys reads only the sidecars (``read_keys``). Entries written before these
fields existed are read whole, as before.
"""

from __future__ import annotations

import hashlib
import json
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
KEYS_SUFFIX = ".keys"
# The unit a lookup reads and verifies: big enough that a shard's entry stays short (about 16
# rows at k=8192 in float16), small enough that one row costs a fraction of a millisecond.
PART_BYTES = 256 * 1024


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
    return _parts_problem(entry)


def _is_count(n, low: int = 1) -> bool:
    return not isinstance(n, bool) and isinstance(n, int) and n >= low


def _parts_problem(entry: dict) -> str | None:
    """What is wrong with an entry's optional ``batches`` and ``keys`` fields, or None."""
    keys = entry.get("keys")
    if keys is not None and not (isinstance(keys, list) and len(keys) == 2 and _is_count(keys[0])
                                 and isinstance(keys[1], str) and _SHA256.match(keys[1])):
        return f"keys {keys!r} is not [bytes, sha256]"
    batches = entry.get("batches")
    if batches is None:
        return None
    end, rows = 0, 0
    for b in batches if isinstance(batches, list) else [None]:
        if not (isinstance(b, list) and len(b) == 4 and _is_count(b[0], 0) and _is_count(b[1])
                and _is_count(b[2]) and isinstance(b[3], str) and _SHA256.match(b[3])) or b[0] < end:
            return f"batch {b!r} is not [offset, bytes, rows, sha256] after the previous one"
        end, rows = b[0] + b[1], rows + b[2]
    if end > entry["bytes"] or rows != entry["rows"]:
        return f"its batches cover {rows} rows up to byte {end}, the shard has {entry['rows']} rows, {entry['bytes']} bytes"
    return None


def write_commit(fs: pafs.FileSystem, base: str, writer_id: str, entries: list[dict]) -> None:
    write_json_atomic(fs, commit_path(base, writer_id), {"writer_id": writer_id, "shards": entries})


def remove_orphans(fs: pafs.FileSystem, base: str, writer_id: str, fmt: str, entries: list[dict]) -> int:
    """Delete this writer's shard and temporary files no commit lists; return the next sequence number."""
    pattern = re.compile(rf"^{re.escape(writer_id)}-(\d{{6,}})\.{EXTENSIONS[fmt]}({re.escape(KEYS_SUFFIX)})?"
                         rf"({re.escape(TMP_MARK)}[0-9a-f]+)?$")
    listed = {e["file"] for e in entries} | {e["file"] + KEYS_SUFFIX for e in entries if "keys" in e}
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
    if fmt == "ipc":
        return serialize_ipc(table)[0]
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def serialize_ipc(table: pa.Table) -> tuple[bytes, list[list]]:
    """An Arrow IPC file of ``table`` in batches of about ``PART_BYTES``, and each batch's
    ``[offset, bytes, rows, sha256]`` in the file."""
    rows = max(1, PART_BYTES * max(1, table.num_rows) // max(1, table.nbytes))
    sink = pa.BufferOutputStream()
    spans = []
    with pa.ipc.new_file(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=rows):
            before = sink.tell()
            w.write_batch(batch)
            # the writer puts the file's head before the first batch: measure that one alone
            size = batch.serialize().size if not spans else sink.tell() - before
            spans.append((sink.tell() - size, size, batch.num_rows))
    data = sink.getvalue().to_pybytes()
    view = memoryview(data)
    return data, [[o, n, r, hashlib.sha256(view[o:o + n]).hexdigest()] for o, n, r in spans]


def encode_keys(keys: list[str]) -> bytes:
    return json.dumps(keys, ensure_ascii=False, separators=(",", ":")).encode()


def write_shard(fs: pafs.FileSystem, base: str, writer_id: str, seq: int, fmt: str,
                table: pa.Table, keys: list[str]) -> dict:
    """Write one shard file (and, for IPC, its keys sidecar) atomically; return its commit entry."""
    file = f"{writer_id}-{seq:06d}.{EXTENSIONS[fmt]}"
    parts = {}
    if fmt == "ipc":
        data, batches = serialize_ipc(table)
        key_bytes = encode_keys(keys)
        atomic_write_bytes(fs, shard_path(base, file) + KEYS_SUFFIX, key_bytes)
        parts = {"batches": batches, "keys": [len(key_bytes), sha256_bytes(key_bytes)]}
    else:
        data = serialize(table, fmt)
    atomic_write_bytes(fs, shard_path(base, file), data)
    # first_key/last_key are the smallest and largest key: lets readers skip shards.
    return {"file": file, "rows": table.num_rows, "bytes": len(data), "sha256": sha256_bytes(data),
            "first_key": min(keys), "last_key": max(keys)} | parts


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


def _read_range(base: str, writer_id: str, entry: dict, path: str, fs: pafs.FileSystem, offset: int,
                size: int, total: int) -> pa.Buffer:
    """``size`` bytes at ``offset`` of a file that must be ``total`` bytes long, into owned memory."""
    try:
        with fs.open_input_file(path) as f:
            if f.size() != total:
                raise _corrupt(base, writer_id, entry, f"({path.rsplit('/', 1)[-1]}) has {f.size()} bytes, "
                                                       f"committed {total}")
            f.seek(offset)
            data = f.read_buffer(size)
    except FileNotFoundError as e:
        raise _corrupt(base, writer_id, entry, f"({path.rsplit('/', 1)[-1]}) is missing") from e
    except OSError as e:
        raise _corrupt(base, writer_id, entry, f"cannot be read ({e})") from e
    if data.size != size:
        raise _corrupt(base, writer_id, entry, f"gave {data.size} bytes at offset {offset}, expected {size}")
    return data


def _check_sha(base: str, writer_id: str, entry: dict, data: pa.Buffer, want: str, what: str) -> None:
    got = hashlib.sha256(memoryview(data)).hexdigest()
    if got != want:
        raise _corrupt(base, writer_id, entry, f"fails the checksum of its {what} (sha256 {got[:12]}..., "
                                               f"committed {want[:12]}...): it was changed after it was written")


def read_keys(fs: pafs.FileSystem, base: str, writer_id: str, entry: dict) -> list[str]:
    """A shard's keys in row order, from its verified sidecar (the entry must have ``keys``)."""
    size, sha = entry["keys"]
    path = shard_path(base, entry["file"]) + KEYS_SUFFIX
    data = _read_range(base, writer_id, entry, path, fs, 0, size, size)
    _check_sha(base, writer_id, entry, data, sha, "keys sidecar")
    keys = json.loads(memoryview(data).tobytes())
    if not isinstance(keys, list) or len(keys) != entry["rows"] or not all(isinstance(k, str) for k in keys):
        raise _corrupt(base, writer_id, entry, f"has a keys sidecar that is not {entry['rows']} strings")
    return keys


def read_part(fs: pafs.FileSystem, base: str, writer_id: str, entry: dict, index: int,
              schema: pa.Schema) -> pa.RecordBatch:
    """Batch ``index`` of a committed IPC shard: only its bytes read, into owned memory, and verified."""
    offset, size, rows, sha = entry["batches"][index]
    data = _read_range(base, writer_id, entry, shard_path(base, entry["file"]), fs, offset, size, entry["bytes"])
    _check_sha(base, writer_id, entry, data, sha, f"batch {index}")
    try:
        batch = pa.ipc.read_record_batch(pa.ipc.read_message(pa.BufferReader(data)), schema)
    except (pa.ArrowInvalid, OSError) as e:
        raise _corrupt(base, writer_id, entry, f"batch {index} cannot be parsed ({e})") from e
    if batch.num_rows != rows:
        raise _corrupt(base, writer_id, entry, f"batch {index} has {batch.num_rows} rows, committed {rows}")
    return batch
