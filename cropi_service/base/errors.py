"""Errors the service adds to cropi's: each carries a stable ``code`` and an HTTP status."""

from __future__ import annotations

from cropi.errors import ConflictError, CropiError, InvalidInputError, NotFoundError


class ServiceConfigError(InvalidInputError):
    """The service was started with settings it refuses (an exposed host without a token, ...)."""

    code = "service_config"


class UnauthorizedError(CropiError):
    """No token, or the wrong one."""

    code = "unauthorized"
    http_status = 401


class PathOutsideRootsError(CropiError):
    """A caller named a path that does not resolve under a configured data root."""

    code = "path_outside_roots"
    http_status = 403


class BodyTooLargeError(CropiError):
    """The request body is larger than ``max_body_bytes``."""

    code = "body_too_large"
    http_status = 413


class UnknownIdError(NotFoundError):
    """An id in the URL or the body names nothing the service knows."""

    code = "not_found"


class DuplicateNameError(ConflictError):
    """A dataset (or checkpoint scoring) with that name already exists or is running."""

    code = "already_exists"


class JobRunningError(ConflictError):
    """The same checkpoint and projection spec are being scored right now."""

    code = "job_running"


class NotReadyError(ConflictError):
    """The result asked for is not there yet: its job has not succeeded."""

    code = "not_ready"


class JobFinishedError(ConflictError):
    """A cancel arrived after the job had already finished."""

    code = "job_finished"


class RankingConflictError(ConflictError):
    """A checkpoint name and spec already scored from other inputs: a new scoring would replace its ranking."""

    code = "ranking_conflict"


class ResponseTooLargeError(CropiError):
    """The answer asked for would be larger than ``max_response_mb``."""

    code = "response_too_large"
    http_status = 413


class BusyError(CropiError):
    """A limit on work in flight is reached (queued jobs, batches being served, registrations)."""

    code = "busy"
    http_status = 429

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OverloadedError(BusyError):
    """A bound on the whole server is reached (answers held for their clients, open connections):
    503, with Retry-After, whoever asks."""

    code = "overloaded"
    http_status = 503


class RegistryFullError(ConflictError):
    """As many datasets or checkpoints are registered as the service holds."""

    code = "registry_full"


class StalledRequestError(CropiError):
    """A request body stopped arriving for longer than ``stall_timeout_s``."""

    code = "request_timeout"
    http_status = 408
