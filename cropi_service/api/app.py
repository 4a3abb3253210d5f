"""``create_app(settings)``: the FastAPI application with its runner, error shape and middleware."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import cropi
from cropi.errors import CropiError, format_validation_error

from ..base.errors import BusyError
from ..base.settings import ServiceSettings
from ..domain.library import CropiLibrary, Library
from ..domain.registry import Registry
from ..domain.service import Service
from ..jobs.runner import Runner
from ..jobs.table import JobStore
from .metrics import Metrics
from .middleware import AccessLog, AnswerFlow, BearerAuth, BodyLimit, HotPaths, log_refusal
from .routes import HOT_READS, router

log = logging.getLogger(__name__)

HTTP_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
              406: "not_acceptable", 413: "body_too_large", 415: "unsupported_media_type"}


def error_response(status: int, code: str, message: str) -> JSONResponse:
    # after a server error the connection is not reused: say so, rather than just dropping it
    headers = {"Connection": "close"} if status >= 500 else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _describe(errors) -> str:
    """Pydantic errors (anything with ``errors()``) as one line a person can act on, the body's place dropped."""
    line = format_validation_error(errors, "request", limit=10,
                                   where=lambda loc: ".".join(str(x) for x in loc if x != "body"))
    return line + ". See /docs for the request schema"


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves as ``{"error": {"code", "message"}}``."""

    @app.exception_handler(CropiError)
    async def cropi_error(request: Request, exc: CropiError) -> JSONResponse:
        if isinstance(exc, BusyError):  # designed: a bound on work or memory in flight, not a fault
            log_refusal(request.url.path, exc)
        elif exc.http_status >= 500:
            log.error("request failed", extra={"path": request.url.path, "code": exc.code, "error": str(exc)})
        response = error_response(exc.http_status, exc.code, str(exc))
        if getattr(exc, "retry_after_s", None) is not None:  # a 429: when trying again makes sense
            response.headers["Retry-After"] = str(exc.retry_after_s)
        return response

    @app.exception_handler(RequestValidationError)
    async def request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "validation_error", _describe(exc))

    @app.exception_handler(pydantic.ValidationError)
    async def model_invalid(request: Request, exc: pydantic.ValidationError) -> JSONResponse:
        # raised when the library validates the fields we pass on (projection, options)
        return error_response(422, "validation_error", f"{exc.title}: " + _describe(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; see /docs for the API"
        elif exc.status_code == 405:
            message = f"{request.url.path} does not accept {request.method}; see /docs for its methods"
        return error_response(exc.status_code, HTTP_CODES.get(exc.status_code, "http_error"), message)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", extra={"path": request.url.path})
        return error_response(500, "internal_error", f"unexpected {type(exc).__name__}; the service log has the "
                                                     "traceback. Please report it")


def create_app(settings: ServiceSettings, *, library: Library | None = None, kinds: dict[str, str] | None = None,
               runner: bool = True) -> FastAPI:
    """The service app. ``library`` and ``kinds`` replace the real cropi adapter and job targets
    (tests); ``runner=False`` serves without running jobs here (external workers run them)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    jobs = JobStore(settings.db_path)
    registry = Registry(settings.db_path)
    job_runner = Runner(settings, jobs, kinds or {})
    library = library or CropiLibrary(settings.root, int(settings.gradient_cache_mb * 2**20))
    svc = Service(settings, library, job_runner, jobs, registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runner and settings.workers > 0:
            job_runner.start()
        log.info("service ready", extra={"root": str(settings.root), "workers": settings.workers,
                                         "auth": settings.token is not None})
        try:
            yield
        finally:
            if job_runner.started:
                job_runner.stop()

    app = FastAPI(title="cropi influence service", version=cropi.__version__, lifespan=lifespan,
                  description="Offline POPI influence scoring and CROPI curricula for RLVR post-training.")
    app.state.service = svc
    app.state.metrics = Metrics(jobs.counts, jobs.prompts_scored, svc.bounds)
    app.include_router(router)
    install_error_handlers(app)
    # outermost first: log and time everything, then auth, then the memory of answers in flight (by
    # caller: after auth), then the body limit, then the in-memory hot reads
    app.add_middleware(HotPaths, service=svc, routes=app.routes, readers=HOT_READS, enabled=settings.fast_path)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, stall_s=settings.stall_timeout_s)
    app.add_middleware(AnswerFlow, ledger=svc.answers)
    app.add_middleware(BearerAuth, token=settings.token)
    app.add_middleware(AccessLog, metrics=app.state.metrics)
    return app
