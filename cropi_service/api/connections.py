"""The server's connections (``cropi serve``): how many may be open, and closing the ones that stall.

uvicorn has neither bound: a client that sends a request and never reads the answer keeps its
connection, and the answer, for as long as it likes (issue 26, W1). ``guarded_protocol`` subclasses
uvicorn's own HTTP protocol (httptools when installed, else h11, as uvicorn's "auto" picks) and adds:

- a bound on open connections: past ``max_connections``, a connection's first request is answered
  503 with Retry-After (the service's JSON error) and the connection closed;
- a stall timeout: a connection is aborted when, for ``stall_timeout_s``, its client has read nothing
  of an answer the server is waiting to write (the transport's buffer stays over its high-water mark)
  or has sent nothing of a request it began. Aborting, not closing: a close waits for the buffer
  to drain, which a client that reads nothing never lets happen. The answer's pending send then
  returns at once, so ``middleware.AnswerFlow`` stops counting it and its memory is freed.

Idle kept-alive connections are closed by uvicorn itself after ``idle_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from ..base.errors import OverloadedError
from ..base.settings import ServiceSettings
from .middleware import log_refusal

log = logging.getLogger(__name__)


def _base_protocol() -> type[asyncio.Protocol]:
    try:
        import httptools  # noqa: F401
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


def refusal_app(max_connections: int, retry_after_s: int):
    """The ASGI app that answers a connection past the bound."""
    err = OverloadedError(f"this server has {max_connections} connections open, as many as it takes "
                          "(max_connections): retry after the seconds in Retry-After, and reuse one connection "
                          "for many requests", retry_after_s=retry_after_s)
    body = json.dumps({"error": {"code": err.code, "message": str(err)}}).encode()

    async def refuse(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        log_refusal(scope["path"], err)
        await send({"type": "http.response.start", "status": err.http_status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", str(retry_after_s).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    return refuse


def guarded_protocol(settings: ServiceSettings, base: type[asyncio.Protocol] | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with the connection bound and the stall timeout of ``settings``."""
    base = base or _base_protocol()
    stall_s, max_connections = settings.stall_timeout_s, settings.max_connections
    refuse = refusal_app(max_connections, retry_after_s=max(1, round(min(stall_s, 30))))

    class GuardedProtocol(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._progress = self.loop.time()
            self._stall_check: asyncio.TimerHandle | None = self.loop.call_later(stall_s, self._check_stall)
            if len(self.connections) > max_connections:  # this one included
                self.app = refuse  # this connection only: its requests get the 503

        def connection_lost(self, exc: Exception | None) -> None:
            if self._stall_check is not None:
                self._stall_check.cancel()
                self._stall_check = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._progress = self.loop.time()
            super().data_received(data)

        def pause_writing(self) -> None:
            self._progress = self.loop.time()  # the client has this long to read
            super().pause_writing()

        def resume_writing(self) -> None:
            self._progress = self.loop.time()
            super().resume_writing()

        def _check_stall(self) -> None:
            self._stall_check = None
            if self.transport is None or self.transport.is_closing():
                return
            quiet = self.loop.time() - self._progress
            # between requests (none yet, or the last one answered) the client owes the next one's bytes;
            # with the write buffer full it owes reading; otherwise the server is working on an answer
            waiting_for_client = self.flow.write_paused or self.cycle is None or self.cycle.response_complete
            if waiting_for_client and quiet >= stall_s:
                log.warning("closing a stalled connection", extra={
                    "client": "%s:%s" % tuple(self.client) if self.client else None,
                    "reading": self.flow.write_paused, "quiet_s": round(quiet, 1)})
                self.transport.abort()
                return
            self._stall_check = self.loop.call_later(max(0.05, stall_s - quiet if waiting_for_client else stall_s),
                                                     self._check_stall)

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{base.__name__}"
    return GuardedProtocol
