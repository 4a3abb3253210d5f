"""``cropi serve`` / ``cropi worker`` (entry points of the "cropi.commands" group: ``main`` takes
the arguments from the command name on) and ``python -m cropi_service {serve,worker}``."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import pydantic

from cropi.errors import CropiError
from ..base.logs import configure_logging
from ..base.settings import ServiceSettings, read_token_file

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8000, token_file: str | Path | None = None, *,
          data_roots: Sequence[str | Path] = (), workers: int = 1, ray_address: str | None = None,
          max_body_bytes: int | None = None) -> None:
    """Run the HTTP service until interrupted. Refuses a non-loopback host without a token."""
    import uvicorn

    from ..api.app import create_app

    fields = {"root": root, "host": host, "port": port, "data_roots": list(data_roots), "workers": workers,
              "ray_address": ray_address}
    if token_file is not None:
        fields["token"] = read_token_file(token_file)
    if max_body_bytes is not None:
        fields["max_body_bytes"] = max_body_bytes
    settings = ServiceSettings(**fields)
    settings.check_bind()
    configure_logging()
    app = create_app(settings)
    settle_process(settings)
    uvicorn.Server(server_config(settings, app)).run()


def settle_process(settings: ServiceSettings) -> None:
    """What ``cropi serve`` sets in its own process, just before it serves: how often a thread hands the
    GIL over (``switch_interval_ms``) and, with ``freeze_startup_heap``, the objects made so far (modules,
    the app) frozen out of the cyclic collector's passes, which hold the GIL and the event loop with it."""
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    if settings.freeze_startup_heap:
        gc.collect()
        gc.freeze()


def server_config(settings: ServiceSettings, app: Any) -> "uvicorn.Config":
    """uvicorn's configuration for ``app``: its protocol bounds open connections and closes stalled ones
    (``api.connections``); kept-alive connections idle for ``idle_timeout_s`` are closed."""
    import uvicorn

    from ..api.connections import guarded_protocol

    return uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                          http=guarded_protocol(settings), timeout_keep_alive=settings.idle_timeout_s)


def run_worker(root: str | Path, name: str, workers: int = 1, ray_address: str | None = None) -> None:
    """Run jobs from the service's queue in this process (no HTTP) until SIGTERM or SIGINT.

    For a separate worker machine or container sharing ``root`` with a service started with
    ``--workers 0``. ``name`` must differ from every other runner's.
    """
    from ..jobs.table import JobStore
    from ..jobs.runner import Runner

    settings = ServiceSettings(root=root, workers=workers, runner_name=name, ray_address=ray_address)
    configure_logging()
    runner = Runner(settings, JobStore(settings.db_path))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    runner.start()
    log.info("worker ready", extra={"root": str(settings.root), "runner": name, "workers": workers})
    stop.wait()
    runner.stop()


def serve_args(s: argparse.ArgumentParser) -> None:
    """The options of ``serve`` (``cropi serve`` and ``python -m cropi_service serve``)."""
    s.add_argument("--root", required=True, help="service state and store directory")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs --token-file)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--token-file", help="file holding the bearer token callers must send")
    s.add_argument("--data-root", action="append", default=[], dest="data_roots",
                   help="directory callers' paths must lie under (repeatable; default: --root)")
    s.add_argument("--workers", type=int, default=1, help="local worker processes (0: external workers only)")
    s.add_argument("--ray-address", help="run jobs as Ray tasks on this cluster (root must be shared storage)")
    s.add_argument("--max-body-bytes", type=int, default=None, help="request body limit (default 1 MiB)")


def run_serve(a: argparse.Namespace) -> None:
    serve(a.root, a.host, a.port, a.token_file, data_roots=a.data_roots, workers=a.workers,
          ray_address=a.ray_address, max_body_bytes=a.max_body_bytes)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cropi", description="cropi influence service")
    sub = p.add_subparsers(dest="command", required=True)
    serve_args(sub.add_parser("serve", help="run the HTTP service (and its local job workers)"))
    w = sub.add_parser("worker", help="run queued jobs of a service sharing --root, without HTTP")
    w.add_argument("--root", required=True)
    w.add_argument("--name", required=True, help="this worker's name (distinct per worker)")
    w.add_argument("--workers", type=int, default=1, help="jobs run at once")
    w.add_argument("--ray-address")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``cropi serve|worker`` and ``python -m cropi_service``."""
    a = build_parser().parse_args(argv)
    try:
        if a.command == "serve":
            run_serve(a)
        else:
            run_worker(a.root, a.name, a.workers, a.ray_address)
    except (CropiError, pydantic.ValidationError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0
