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
