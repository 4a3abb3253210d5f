"""ASGI middleware: request log and metrics, bearer-token auth, request body size limit."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qsl

from ..domain.errors import BodyTooLargeError, UnauthorizedError
from .metrics import Metrics
from .schemas import NAME_MAX, OFFSET_MAX, PAGE_DEFAULT, PAGE_MAX

log = logging.getLogger(__name__)

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/healthz"})


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


class BodyLimit:
    """Refuses bodies over ``limit`` bytes with 413, whether or not they declare a Content-Length.

    The body is read here (at most ``limit`` bytes are ever held) and replayed to the app.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        chunks, size = [], 0
        while True:
            message = await receive()
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


_RANKING = re.compile(r"/v1/checkpoints/([^/]{1,64})/ranking")
_GRADIENT = re.compile(r"/v1/checkpoints/([^/]{1,64})/gradients/(.{1,1024})", re.DOTALL)
_DIGITS = re.compile(r"[0-9]{1,10}")
_ARROW = b"application/vnd.apache.arrow.stream"


def _simple_query(raw: bytes, allowed: frozenset[str]) -> dict[str, str] | None:
    """The query as a dict when every key is in ``allowed``, given once and with a non-empty value; else None."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for k, v in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):  # as starlette parses it
        if k not in allowed or k in out or not v:
            return None
        out[k] = v
    return out


def _bounded_int(value: str | None, default: int, lo: int, hi: int) -> int | None:
    if value is None:
        return default
    if not _DIGITS.fullmatch(value):
        return None
    n = int(value)
    return n if lo <= n <= hi else None


class HotPaths:
    """Answers the two hot reads, a ranking page and a single gradient lookup as JSON, straight from
    the service's memory when everything they need is loaded and fresh (``Service.peek_*``).

    Only plain, valid requests are taken (GET, known query fields each given once with values the
    route accepts, no Arrow ``Accept``); the body is made by the same code as the route's, and the
    route object is put in the scope as the router does, so logs and metrics name the route. Any
    other request, anything not in memory (or a version stamp due for a look at the disk) and any
    error goes to the full FastAPI route, which validates, loads and reports as before. The
    FastAPI request machinery (parameter validation, threadpool hop) costs more than the read itself.
    """

    def __init__(self, app: ASGIApp, service: Any, routes: dict[str, Any], enabled: bool = True):
        self.app, self.service, self.enabled = app, service, enabled
        self.ranking_route, self.gradient_route = routes.get("get_ranking"), routes.get("get_gradient")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enabled and scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            try:
                hit = self._answer(scope)
            except Exception:  # noqa: BLE001 - the full route answers (and reports) whatever went wrong
                hit = None
            if hit is not None:
                route, body = hit
                scope["route"] = route
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-length", str(len(body)).encode()),
                                        (b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def _answer(self, scope: Scope) -> tuple[Any, bytes] | None:
        path = scope["path"]
        if "\n" in path or "\r" in path or not path.startswith("/v1/checkpoints/"):
            return None
        m = _RANKING.fullmatch(path)
        if m is not None and self.ranking_route is not None:
            q = _simple_query(scope.get("query_string", b""), frozenset({"offset", "limit", "validation"}))
            if q is None:
                return None
            offset = _bounded_int(q.get("offset"), 0, 0, OFFSET_MAX)  # the route's bounds (schemas.py)
            limit = _bounded_int(q.get("limit"), PAGE_DEFAULT, 1, PAGE_MAX)
            validation = q.get("validation")
            if offset is None or limit is None or (validation is not None and len(validation) > NAME_MAX):
                return None
            body = self.service.peek_ranking_page(m.group(1), offset, limit, validation)
            return (self.ranking_route, body) if body is not None else None
        m = _GRADIENT.fullmatch(path)
        if m is not None and self.gradient_route is not None:
            q = _simple_query(scope.get("query_string", b""), frozenset({"split"}))
            if q is None or len(q.get("split", "")) > NAME_MAX:
                return None
            if any(k == b"accept" and _ARROW in v for k, v in scope["headers"]):
                return None
            body = self.service.peek_gradient_json(m.group(1), m.group(2), q.get("split"))
            return (self.gradient_route, body) if body is not None else None
        return None
