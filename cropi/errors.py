"""Error types shared across cropi.

Every error a user can cause is a ``CropiError`` with a message that says what is
wrong and what to do. The service maps ``code`` to a stable JSON error code.
"""

from __future__ import annotations


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
