"""A dataset's manifest: its identity, format, key and schema, written once.

The identity says what the data *is* (which checkpoint, which projection spec,
which sampling settings...). Reopening a directory with another identity is
refused, field by field, so results from different settings never mix.

A manifest records the sha256 of its own content (``content_sha256``), and its
fields are checked against each other (columns against the schema, a vector
``dim``/``dtype`` against the vector column), so one edited by hand is refused
with an error naming it, rather than failing later with an unexplained one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from cropi.errors import CorruptDataError, InvalidInputError, MismatchError, NotFoundError
from cropi.store.schema import decode_schema, encode_schema
from cropi.utils.fsio import file_exists, read_json, write_json_atomic

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


def normalize(identity: dict) -> dict:
    """The identity as it reads back from JSON (tuples become lists, keys strings)."""
    if not isinstance(identity, dict):
        raise InvalidInputError(f"identity must be a dict, got {type(identity).__name__}")
    try:
        return json.loads(json.dumps(identity, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"identity is not plain JSON ({e}); use dicts, lists, strings and "
                                "finite numbers (call model_dump() on pydantic models)") from e


def make_manifest(identity: dict, fmt: str, key: str, schema: pa.Schema) -> dict:
    manifest = {"version": MANIFEST_VERSION, "identity": normalize(identity), "format": fmt, "key": key,
                "schema": encode_schema(schema), "columns": _columns(schema)}
    return manifest | {"content_sha256": content_sha256(manifest)}


def content_sha256(manifest: dict) -> str:
    """sha256 of a manifest's content, its own ``content_sha256`` field left out."""
    body = {k: v for k, v in manifest.items() if k != "content_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _columns(schema: pa.Schema) -> dict[str, str]:
    return {f.name: str(f.type) for f in schema}


def diff_fields(stored: Any, given: Any, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ, each with both values."""
    if isinstance(stored, dict) and isinstance(given, dict):
        out = []
        for k in sorted(set(stored) | set(given)):
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in stored:
                out.append(f"{path} (not stored, given {_short(given[k])})")
            elif k not in given:
                out.append(f"{path} (stored {_short(stored[k])}, not given)")
            else:
                out += diff_fields(stored[k], given[k], path)
        return out
    if stored == given and isinstance(stored, bool) == isinstance(given, bool):
        return []
    return [f"{prefix or '(whole value)'} (stored {_short(stored)}, given {_short(given)})"]


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def create_or_check(fs: pafs.FileSystem, base: str, want: dict) -> dict:
    """Write ``want`` as the manifest of ``base`` unless one exists; refuse a different one."""
    path = f"{base}/{MANIFEST}"
    if not file_exists(fs, path):
        write_json_atomic(fs, path, want)
    stored = read_manifest(fs, base)
    # Re-read even after writing: a concurrent creator with another identity may have won.
    fields = diff_fields(_comparable(stored), _comparable(want))
    if fields:
        raise MismatchError(f"{base} already holds a dataset with a different identity; differing fields: "
                            + "; ".join(fields) + f". Write to another name or directory, or delete {base} "
                            "to recompute it (its data is left untouched)")
    return stored


def _comparable(manifest: dict) -> dict:
    return {k: manifest.get(k) for k in ("identity", "format", "key", "columns", "schema")}


def read_manifest(fs: pafs.FileSystem, base: str) -> dict:
    """The stored manifest of ``base``; NotFoundError if there is none."""
    path = f"{base}/{MANIFEST}"
    if not file_exists(fs, path):
        raise NotFoundError(f"no dataset at {base} (no {MANIFEST}); create it first or check the path")
    manifest = read_json(fs, path)
    if (not isinstance(manifest, dict) or not {"identity", "format", "key", "schema"} <= set(manifest)
            or not isinstance(manifest["schema"], str)):
        raise CorruptDataError(f"{path} is not a cropi manifest; restore it or delete {base} and recompute")
    if manifest.get("version") != MANIFEST_VERSION:
        raise MismatchError(f"{path} has manifest version {manifest.get('version')}, this cropi reads "
                            f"{MANIFEST_VERSION}; use a matching cropi or recompute the dataset")
    problem = _inconsistency(manifest, decode_schema(manifest["schema"], path))
    if problem is None and "content_sha256" in manifest and manifest["content_sha256"] != content_sha256(manifest):
        problem = "its content does not match its recorded content_sha256"
    if problem:  # manifests written before content_sha256 existed get the field checks only
        raise CorruptDataError(f"{path} was edited after it was written: {problem}. Restore it from a backup "
                               f"(it must describe the stored shards), or delete {base} and recompute it")
    return manifest


def _inconsistency(manifest: dict, schema: pa.Schema) -> str | None:
    """The first way a manifest's fields disagree with each other, or None."""
    if "columns" in manifest and manifest["columns"] != _columns(schema):
        return f"columns {_short(manifest['columns'])} do not match its schema {_short(_columns(schema))}"
    identity = manifest["identity"] if isinstance(manifest["identity"], dict) else {}
    index = schema.get_field_index("vector")
    vector = schema.field(index).type if index >= 0 else None
    if vector is None or not pa.types.is_fixed_size_list(vector):
        return None
    if "dim" in identity and identity["dim"] != vector.list_size:
        return f"identity dim is {identity['dim']!r}, but its vector column holds {vector.list_size} values a row"
    if "dtype" in identity and str(identity["dtype"]) != {"halffloat": "float16", "float": "float32"}.get(
            str(vector.value_type), str(vector.value_type)):
        return f"identity dtype is {identity['dtype']!r}, but its vector column holds {vector.value_type}"
    return None


def manifest_schema(manifest: dict, base: str) -> pa.Schema:
    return decode_schema(manifest["schema"], f"{base}/{MANIFEST}")
