"""Error types shared across cropi.

Every error a user can cause is a ``CropiError`` with a message that says what is
wrong and what to do. The service maps ``code`` to a stable JSON error code.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


class CropiError(Exception):
    """Base class: something the caller can fix."""

    code = "cropi_error"
    http_status = 400


class InvalidInputError(CropiError, ValueError):
    """Malformed input: a file, a record, a setting."""

    code = "invalid_input"
    http_status = 400


class NotFoundError(CropiError, LookupError):
    """A named thing (dataset, checkpoint, prompt, job, split) does not exist."""

    code = "not_found"
    http_status = 404


class MismatchError(CropiError):
    """Two things that must agree do not (projection specs, checkpoints, tokenizers)."""

    code = "mismatch"
    http_status = 409


class ConflictError(CropiError):
    """The request conflicts with current state (a job already running)."""

    code = "conflict"
    http_status = 409


class CorruptDataError(CropiError):
    """Stored data failed a checksum or schema check."""

    code = "corrupt_data"
    http_status = 500


class StorageFullError(CropiError, OSError):
    """A write found its device (or the user's quota on it) full. Writes are atomic, so nothing
    committed before it is lost, and every job resumes from what it committed. Still an ``OSError``
    (its ``errno`` the original's), so code that lets a failed write pass goes on doing so."""

    code = "storage_full"
    http_status = 507  # Insufficient Storage


NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def storage_full(exc: BaseException, path: str | None = None) -> StorageFullError | None:
    """The ``StorageFullError`` that ``exc`` stands for when it is an ``OSError`` of a full device or
    quota (``path``: what was being written, else the error's own filename); None for any other error.
    The one spelling of that message for the stores' writes, the CLI and the service's jobs."""
    if isinstance(exc, StorageFullError):
        return exc
    if not isinstance(exc, OSError) or exc.errno not in NO_SPACE:
        return None
    where = path or exc.filename
    error = StorageFullError(
        f"no space left on the device to write {where or 'a file'}{_free_space(where)}: free space there, or "
        "give a root or store on a larger device, then rerun the same command: what was committed before "
        "this write is kept and the rerun resumes from it")
    error.errno = exc.errno
    return error


def _free_space(path) -> str:
    """`` (N GB free of M GB)`` for the device holding ``path`` (its nearest existing folder); empty when
    that cannot be read (a remote store, a path with no existing parent)."""
    if not path:
        return ""
    folder = Path(str(path))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return ""
    return f" ({usage.free / 1e9:.2f} GB free of {usage.total / 1e9:.1f} GB)"


def format_validation_error(error, whole: str = "value", *, where=None, limit: int | None = None) -> str:
    """Pydantic's complaints (a ``ValidationError``, or anything with its ``errors()``) as one line a
    person can act on: ``field.sub: message; other: message``.

    ``whole`` names the place of an error about the value as a whole (an empty location);
    ``where(loc)`` renders a location (default: its parts joined by dots, as in a config file);
    ``limit`` keeps the first ``limit`` problems and counts the rest, for errors that could be many.
    The one spelling of this line for every options model, job file and flag set of the library.
    """
    errors = list(error.errors())
    render = where or (lambda loc: ".".join(str(p) for p in loc))
    shown = errors if limit is None else errors[:limit]
    line = "; ".join(f"{render(tuple(err.get('loc', ()))) or whole}: {err.get('msg', 'invalid')}" for err in shown)
    return line + (f" (and {len(errors) - len(shown)} more)" if len(shown) < len(errors) else "")
