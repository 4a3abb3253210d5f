"""File I/O on pyarrow filesystems: resolve a root, write atomically, hash, JSON.

A store root is either a plain local path or any URI ``pyarrow.fs`` understands
(``file://``, ``s3://``, ``gs://``, ``hdfs://``, ...). Writes go to a temporary
sibling first and are moved over the target, so a reader sees the old file or
the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from typing import Any

import pyarrow.fs as pafs

from cropi.errors import CorruptDataError, InvalidInputError, NotFoundError, storage_full

TMP_MARK = ".tmp-"  # temporary files are "<target>.tmp-<uuid hex>"
_CHUNK = 1 << 20


def resolve(root: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and base path of a store root (local path or pyarrow URI)."""
    if not isinstance(root, (str, os.PathLike)) or not str(root).strip():
        raise InvalidInputError(f"store root must be a non-empty path or URI, got {root!r}")
    root = str(root)
    if "://" in root:
        try:
            fs, path = pafs.FileSystem.from_uri(root)
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError for bad or unsupported URIs
            raise InvalidInputError(f"cannot open store root {root!r}: {e}; "
                                    "give a local path or a URI pyarrow.fs supports") from e
        return fs, path.rstrip("/") or path
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(root))


def is_local(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.LocalFileSystem)


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def file_exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.File


def atomic_write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers never see a partial file.

    The bytes go to ``path + ".tmp-<uuid>"`` and are then moved over ``path``.
    On the local filesystem the file is fsynced before the move and the directory
    after it, so a crash cannot leave a renamed but empty file. A full device (or quota)
    raises ``StorageFullError``, the temporary file removed and ``path`` as it was.
    """
    tmp = f"{path}{TMP_MARK}{uuid.uuid4().hex}"
    if parent(path):
        fs.create_dir(parent(path), recursive=True)
    try:
        if is_local(fs):
            _write_local_synced(tmp, data)
        else:
            with fs.open_output_stream(tmp) as out:
                out.write(data)
        fs.move(tmp, path)
    except BaseException as e:
        _remove_quietly(fs, tmp)
        full = storage_full(e, path)
        if full is not None:
            raise full from e
        raise
    if is_local(fs):
        _fsync_dir(parent(path))


def _write_local_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return  # some platforms cannot open directories; durability is best effort there
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except (OSError, FileNotFoundError):
        pass


def write_json_atomic(fs: pafs.FileSystem, path: str, obj: Any) -> None:
    """Atomically write ``obj`` as JSON (sorted keys, so equal objects give equal bytes)."""
    try:
        text = json.dumps(obj, sort_keys=True, indent=1, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"cannot write {path} as JSON: {e}; pass plain dicts, lists, "
                                "strings and finite numbers") from e
    atomic_write_bytes(fs, path, text.encode("utf-8") + b"\n")


def read_json(fs: pafs.FileSystem, path: str) -> Any:
    """Parse a JSON file; NotFoundError if absent, CorruptDataError if unparsable."""
    try:
        with fs.open_input_stream(path) as f:
            raw = f.read()
    except FileNotFoundError as e:
        raise NotFoundError(f"{path} does not exist") from e
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptDataError(f"{path} is not valid JSON ({e}); restore it or delete it and rerun") from e


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(fs: pafs.FileSystem, path: str) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (never the whole file at once)."""
    h = hashlib.sha256()
    with fs.open_input_stream(path) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
