"""What the service benchmarks share (service.py, service_bounds.py, service_hotpath.py): a real server
started and stopped, its RSS sampled, latency percentiles, and the open and closed load loops.

Imports no torch: the load generator shares the machine with the server it measures.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path, port: int, token_file: Path, log: Path, env: dict[str, str] | None = None, *,
                 code: Path = REPO, package: str = "cropi_service") -> subprocess.Popen:
    """``python -m <package> serve`` on ``root`` from the folder ``code`` (``env`` added to this process's:
    the server's settings), once /healthz answers."""
    cmd = [sys.executable, "-m", package, "serve", "--root", str(root), "--port", str(port),
           "--token-file", str(token_file), "--workers", "0"]
    proc = subprocess.Popen(cmd, cwd=code, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    stop_server(proc)
    raise SystemExit(f"the server did not come up; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM (the server hands its jobs back), SIGKILL if it has not stopped within 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class RssSampler:
    """The server process's resident set size, sampled every ``every`` seconds in a thread."""

    def __init__(self, pid: int, every: float = 0.1):
        self.pid, self.every, self.samples = pid, every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            kb = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS")), None)
            if kb is not None:
                self.samples.append(kb / 1024)
            self._stop.wait(self.every)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        a = np.asarray(self.samples or [0.0])
        return {"server_rss_max_mb": round(float(a.max()), 1), "server_rss_samples": len(self.samples),
                "server_rss_median_mb": round(float(np.median(a)), 1), "server_rss_last_mb": round(float(a[-1]), 1)}


def percentiles(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples) * 1000
    return {"n": len(a), "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "max_ms": round(float(a.max()), 2)}


# the load: half ranking pages of 1,000 rows, half gradient lookups (JSON), over the checkpoints at random

async def _send(c, kind: str, cks: list[str], rng: random.Random, pool_ids: list[str], total: int):
    ck = rng.choice(cks)  # mixed over the checkpoints served together
    if kind == "ranking":
        return await c.get(f"/v1/checkpoints/{ck}/ranking",
                           params={"offset": rng.randrange(0, max(1, total - 1000)), "limit": 1000})
    return await c.get(f"/v1/checkpoints/{ck}/gradients/{rng.choice(pool_ids)}")


def _summary(latencies: dict[str, list[float]], errors: dict[str, int], wall: float) -> dict:
    done = sum(len(v) for v in latencies.values())
    return {"seconds": round(wall, 1), "requests": done, "requests_per_s": round(done / wall, 1),
            "errors": sum(errors.values()), "error_kinds": errors,
            "ranking_page_1000": percentiles(latencies["ranking"]) if latencies["ranking"] else None,
            "gradient_lookup_json": percentiles(latencies["gradient"]) if latencies["gradient"] else None}


def _clients(base: str, token: str, n: int) -> list:
    """``n`` async clients of one connection each."""
    import httpx

    return [httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60,
                              limits=httpx.Limits(max_connections=1)) for _ in range(n)]


async def _load(base: str, token: str, cks: list[str], pool_ids: list[str], total: int, clients: int,
                duration: float, per_client: float | None) -> dict:
    """The one loop of both loads. ``per_client`` requests/s: each client on its own Poisson schedule, a
    latency counted from when its request was due (open loop); None: each client sends its next request
    as soon as the last one answered (closed loop)."""
    import httpx

    latencies: dict[str, list[float]] = {"ranking": [], "gradient": []}
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    conns = _clients(base, token, clients)  # made before the clock starts: a client costs ~20 ms of CPU to make
    start = loop.time() + (0.5 if per_client else 0.0)
    stop_at = start + duration

    def next_due(rng: random.Random, after: float) -> float:
        return after + rng.expovariate(per_client) if per_client else loop.time()

    async def client(i: int) -> None:
        rng = random.Random(1000 + i if per_client else i)
        async with conns[i] as c:
            due = next_due(rng, start)
            while due < stop_at:
                if per_client:
                    await asyncio.sleep(max(0.0, due - loop.time()))
                kind = "ranking" if rng.random() < 0.5 else "gradient"
                try:
                    r = await _send(c, kind, cks, rng, pool_ids, total)
                    ok, key = r.status_code == 200, str(r.status_code)
                except httpx.HTTPError as e:
                    ok, key = False, type(e).__name__
                if ok:
                    latencies[kind].append(loop.time() - due)
                else:
                    errors[key] = errors.get(key, 0) + 1
                due = next_due(rng, due)

    began = loop.time()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return _summary(latencies, errors, duration if per_client else loop.time() - began)


async def open_loop(base: str, token: str, cks: list[str], pool_ids: list[str], total: int, clients: int,
                    rate: float, duration: float) -> dict:
    """``clients`` clients (one connection each) offering ``rate`` requests/s in total, half ranking
    pages and half gradient lookups, each on its own Poisson schedule. A latency counts from the
    moment the request was due, so time spent queued behind a slow answer is in it (no
    coordinated omission)."""
    out = await _load(base, token, cks, pool_ids, total, clients, duration, rate / clients)
    return {"clients": clients, "offered_rps": rate, "duration_s": duration, **out}


async def closed_loop(base: str, token: str, cks: list[str], pool_ids: list[str], total: int, clients: int,
                      duration: float) -> dict:
    """``clients`` clients each sending its next request as soon as the last one answered: the
    maximum throughput, with the latencies it costs."""
    return {"clients": clients, **await _load(base, token, cks, pool_ids, total, clients, duration, None)}
