"""ASGI middleware: request log and metrics, bearer-token auth, the memory of answers in flight, request
body size limit, the hot reads."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from starlette.datastructures import Headers, QueryParams
from starlette.routing import Match

from ..base.errors import BodyTooLargeError, BusyError, StalledRequestError, UnauthorizedError
from ..domain.flight import AnswerLedger, Reservation
from .metrics import Metrics

log = logging.getLogger(__name__)

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/healthz"})  # answered without a token
# Never refused for the memory of answers in flight: small answers the operator needs most when the server
# is full (the metrics still need a token).
UNMETERED_PATHS = OPEN_PATHS | {"/metrics"}


def log_refusal(path: str, err: BusyError) -> None:
    """A designed refusal is no fault: a caller's bound (429) is logged at info, the server's (503) at
    warning; level error stays for faults, so a flood of clients does not fill it."""
    level = logging.WARNING if err.http_status >= 500 else logging.INFO
    log.log(level, "request refused", extra={"path": path, "status": err.http_status, "code": err.code,
                                              "retry_after_s": err.retry_after_s, "error": str(err)})


async def send_error(send: Send, status: int, code: str, message: str, headers: list | None = None) -> None:
    """Answer with the service's JSON error shape, from below the FastAPI app."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class AccessLog:
    """Times every request, logs it as one JSON line and feeds the latency histogram by route."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe(scope["method"], route, status, elapsed)
            log.info("request", extra={"method": scope["method"], "route": route, "path": scope["path"],
                                       "status": status, "ms": round(elapsed * 1000, 2)})


ANONYMOUS = "anonymous"  # the caller when no token is configured (loopback only)


def caller_of(token: bytes) -> str:
    """A caller's name in job rows and logs: a hash of its token, never the token."""
    return "token-" + hashlib.sha256(token).hexdigest()[:12]


class BearerAuth:
    """With tokens configured, every path but the health check needs exactly one ``Authorization: Bearer
    <token>`` header with one of them; the request's ``state.caller`` names whose token it was."""

    def __init__(self, app: ASGIApp, token: str | None):
        self.app = app
        self.tokens = [t.strip().encode() for t in (token or "").splitlines() if t.strip()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens or scope["path"] in OPEN_PATHS:
            if scope["type"] == "http":
                scope.setdefault("state", {})["caller"] = ANONYMOUS
            return await self.app(scope, receive, send)
        headers = [v for k, v in scope["headers"] if k == b"authorization"]
        scheme, _, given = (headers[0] if headers else b"").partition(b" ")
        # compare_digest takes time independent of where the strings differ; every token is compared
        matches = [t for t in self.tokens if hmac.compare_digest(given.strip(), t)]
        if len(headers) == 1 and scheme.lower() == b"bearer" and matches:
            scope.setdefault("state", {})["caller"] = caller_of(matches[0])
            return await self.app(scope, receive, send)
        err = UnauthorizedError(
            f"{len(headers)} Authorization headers: send exactly one" if len(headers) > 1 else
            "missing or wrong token: send the header 'Authorization: Bearer <token>' "
            "with the token the service was started with")
        await send_error(send, err.http_status, err.code, str(err), [(b"www-authenticate", b"Bearer")])


HELD = "answer_reservation"  # where a route leaves its answer's reservation in the request's state
# An answer goes to the connection this much at a time, each piece after the connection took the last
# (the server's send waits while the transport's buffer is over its high-water mark, 64 KiB): a client
# that reads nothing holds at most a piece and the buffer in the transport, and the rest of its answer
# stays here, counted, until the connection is closed.
SEND_PIECE = 1 << 16


def hold_answer(scope: Scope, reservation: Reservation) -> None:
    """Leave ``reservation`` for ``AnswerFlow``, which keeps it until the answer is sent, then releases it."""
    scope.setdefault("state", {})[HELD] = reservation


class AnswerFlow:
    """Bounds the memory of answers in flight (issue 26, W1: 24 clients that sent a 10k-id Arrow batch
    and never read the answer held 1.3 GB, freed only when they disconnected).

    - A request is refused (429 for its caller, 503 for the server, with Retry-After) while the
      answers of its caller, or of everyone, not yet handed to the network fill their bound.
    - Every answer's body is counted in the ledger from when it is made (a route that reserved its
      answer's bound before making it leaves the reservation with ``hold_answer``) until its last
      piece has been taken by the connection, or the connection is gone. Pieces go one at a time, so
      the answer is not copied whole into the transport's buffer, where it would be held uncounted.
    - A client that reads nothing is closed by the server's protocol after ``stall_timeout_s``
      (``api.connections``): its pending send then returns, which ends the count.

    The health check and the metrics are never refused."""

    def __init__(self, app: ASGIApp, ledger: AnswerLedger):
        self.app, self.ledger = app, ledger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNMETERED_PATHS:
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        caller = state.get("caller") or ANONYMOUS
        try:
            self.ledger.admit(caller)
        except BusyError as e:
            log_refusal(scope["path"], e)
            retry = [(b"retry-after", str(e.retry_after_s).encode())]
            return await send_error(send, e.http_status, e.code, str(e), retry)

        async def send_in_pieces(message: dict) -> None:
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if len(body) <= SEND_PIECE:
                return await send(message)
            held = state.pop(HELD, None) or self.ledger.reserve(caller, len(body), check=False)
            held.resize(len(body))
            try:
                more, view = message.get("more_body", False), memoryview(body)
                for start in range(0, len(body), SEND_PIECE):
                    end = start + SEND_PIECE
                    # bytes, not a view: the transport may keep what it is given, and a view keeps the whole
                    await send({"type": "http.response.body", "body": bytes(view[start:end]),
                                "more_body": more or end < len(body)})
            finally:
                held.release()

        try:
            await self.app(scope, receive, send_in_pieces)
        finally:
            held = state.pop(HELD, None)  # an answer reserved but never sent (an error on the way)
            if held is not None:
                held.release()


class BodyLimit:
    """Refuses bodies over ``limit`` bytes with 413, whether or not they declare a Content-Length.

    The body is read here (at most ``limit`` bytes are ever held) and replayed to the app. A body that
    stops arriving for ``stall_s`` is answered 408 and its connection closed (a slow sender would
    otherwise hold its connection and what it sent so far for as long as it likes).
    """

    def __init__(self, app: ASGIApp, limit: int, stall_s: float | None = None):
        self.app, self.limit, self.stall_s = app, limit, stall_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.stall_s)
            except asyncio.TimeoutError:
                err = StalledRequestError(f"the request body stopped arriving for {self.stall_s:g} s "
                                          "(stall_timeout_s): send it whole, without pauses")
                return await send_error(send, err.http_status, err.code, str(err), [(b"connection", b"close")])
            if message["type"] != "http.request":  # client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await self._refuse(send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for http.disconnect as usual

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        err = BodyTooLargeError(f"the request body is larger than {self.limit} bytes: send fewer items per "
                                "request (for example split a gradients batch)")
        await send_error(send, err.http_status, err.code, str(err), [(b"connection", b"close")])


class HotPaths:
    """Answers the hot reads (a ranking page, a single gradient lookup) straight from the service's
    memory when everything they need is loaded and fresh.

    Each is taken under its route's own contract: the router's path pattern matches, the route's
    declared path, query and header parameters (one model of them, ``route_parameters``) validate, and the
    route's reader (``routes.HOT_READS``) makes the body with ``peek=True``, which raises at the first
    step that would read the database or the disk. Then, and for any invalid request or any error,
    the full FastAPI route answers, validating, loading and reporting as before. What is skipped is
    FastAPI's request machinery (dependency solving, the threadpool hop), which costs more than the
    read itself. The route object is put in the scope as the router does, so logs and metrics name it.
    """

    def __init__(self, app: ASGIApp, service: Any, routes: list, readers: dict[str, Callable[..., tuple[bytes, str]]],
                 enabled: bool = True):
        self.app, self.service, self.enabled = app, service, enabled
        self.hot = [(r, readers[r.name], route_parameters(r)) for r in routes
                    if isinstance(r, APIRoute) and r.name in readers]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enabled and scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            try:
                hit = self._answer(scope)
            except Exception:  # noqa: BLE001 - the full route answers (and reports) whatever went wrong
                hit = None
            if hit is not None:
                route, (body, media_type) = hit
                scope["route"] = route
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-length", str(len(body)).encode()),
                                        (b"content-type", media_type.encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def _answer(self, scope: Scope) -> tuple[APIRoute, tuple[bytes, str]] | None:
        for route, read, parameters in self.hot:
            match, child = route.matches(scope)
            if match is not Match.FULL:
                continue
            query, headers = QueryParams(scope.get("query_string", b"")), Headers(scope=scope)
            given = {**child["path_params"], **{k: query[k] for k in parameters.query if k in query},
                     **{k: headers[k] for k in parameters.header if k in headers}}
            try:
                values = parameters.model.model_validate(given)
            except ValidationError:
                return None
            return route, read(self.service, **dict(values), peek=True)
        return None


@dataclass(frozen=True)
class RouteParameters:
    model: type[BaseModel]  # the route's path, query and header parameters, as declared in its signature
    query: tuple[str, ...]
    header: tuple[str, ...]


def route_parameters(route: APIRoute) -> RouteParameters:
    """One model of the parameters ``route`` declares (their types, bounds and defaults as written in its
    signature), validated in one call: FastAPI's per-parameter validation costs more than the hot read."""
    d = route.dependant
    declared = (*d.path_params, *d.query_params, *d.header_params)
    fields = {f.name: (f.field_info.annotation, f.field_info) for f in declared}
    for f in (*d.query_params, *d.header_params):
        if f.alias != f.name:
            raise TypeError(f"route {route.name}: parameter {f.name} is sent as {f.alias}; give it its own name")
    model = create_model(f"{route.name}_parameters", __config__=ConfigDict(extra="ignore"), **fields)
    return RouteParameters(model, tuple(f.name for f in d.query_params), tuple(f.name for f in d.header_params))
