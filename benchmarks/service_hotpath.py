"""Per-request server cost of the two hot reads, before and after, side by side in one run.

    python benchmarks/service_hotpath.py --out DIR [--baseline REV --prompts 5000 --dim 8192]

The reads: a ranking page of 1,000 rows (``GET /v1/checkpoints/<id>/ranking?offset=&limit=1000``)
and a single gradient lookup as JSON (``GET /v1/checkpoints/<id>/gradients/<prompt id>``, float16).
"old" is the service at ``--baseline`` (its ``services`` package taken from git), "new" the working
tree; both serve one store built as benchmarks/service.py builds it (smaller: ``--prompts``).

1. In-process: the real ASGI apps (middleware, auth, JSON logs to a file, metrics) called directly,
   old and new alternating request by request on the same random offsets and prompt ids; per
   request the wall time and the process CPU time (threads included). "new_full_route" is the
   new app with its fast path off (``fast_path=False``).
2. Real servers (``python -m services serve``, uvicorn), old and new at once on two ports:
   server CPU seconds per request (from /proc) over sequential requests, alternating blocks; then
   a closed loop of ``--clients`` clients for ``--duration`` s (old, new, old, new) for
   requests/s, and an open loop of ``--rate`` requests/s (half pages, half lookups) for its p99.
   The load generator shares the machine's CPUs with the server: figures are for comparing old
   with new in the same run, not absolute.

Writes benchmarks/results/service_hotpath.json (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import os
import platform
import random
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from service import NAME, register, write_checkpoint, write_report  # noqa: E402 (benchmarks/: the script's folder)
from serving import closed_loop, free_port, open_loop, percentiles, start_server, stop_server  # noqa: E402
from cropi.projection import ProjectionSpec  # noqa: E402
from cropi_service.base.settings import ServiceSettings  # noqa: E402

TOKEN = "hotpath-benchmark-token"
DEFAULT_BASELINE = "0dd36ba"  # the service before the fast path (README: online filtering benchmarks)


def build(root: Path, prompts: int, dim: int) -> tuple[str, int]:
    """The store and a scored checkpoint (benchmarks/service.py's synthetic one); returns (checkpoint id,
    ranked prompts)."""
    settings = ServiceSettings(root=root)
    built = write_checkpoint(settings.store, ProjectionSpec(dim=dim), NAME, prompts, 100, dim, seed=0)
    return register(settings, ProjectionSpec(dim=dim).spec_id, [NAME])[0], built["ranked"]


def extract_baseline(rev: str, into: Path) -> Path:
    """``services/`` at ``rev`` under ``into/services`` (for the old server) and ``into/pkg/services_baseline``
    (importable beside the new one in this process)."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, "services"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    (into / "pkg").mkdir()
    shutil.copytree(into / "services", into / "pkg" / "services_baseline")
    return into


# 1. in-process

def asgi_caller(app):
    async def call(path: str, query: bytes = b"") -> bytes:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
                 "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {TOKEN}".encode()),
                             (b"accept", b"*/*")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        out: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            out.append(message)

        await app(scope, receive, send)
        if out[0]["status"] != 200:
            raise RuntimeError(f"{path}: {out[0]['status']} {out[1:]}")
        return b"".join(m.get("body", b"") for m in out[1:])
    return call


def in_process(root: Path, baseline_pkg: Path, ck: str, ranked: int, prompts: int, n: int, log_file: Path) -> dict:
    sys.path.insert(0, str(baseline_pkg))
    from services_baseline.api.app import create_app as create_old  # noqa: PLC0415
    from cropi_service.api.app import create_app as create_new  # noqa: PLC0415
    from cropi_service.base.logs import JsonFormatter  # noqa: PLC0415

    handler = logging.StreamHandler(open(log_file, "a"))  # one JSON line per request, as the server logs
    handler.setFormatter(JsonFormatter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    settings = dict(root=root, token=TOKEN, workers=0)
    apps = {"old": create_old(ServiceSettings(**settings), runner=False),
            "new": create_new(ServiceSettings(**settings), runner=False),
            "new_full_route": create_new(ServiceSettings(**settings, fast_path=False), runner=False)}
    calls = {k: asgi_caller(a) for k, a in apps.items()}
    rng = random.Random(0)
    kinds = {"ranking_page_1000": lambda: (f"/v1/checkpoints/{ck}/ranking",
                                           f"offset={rng.randrange(0, max(1, ranked - 1000))}&limit=1000".encode()),
             "gradient_lookup_json": lambda: (f"/v1/checkpoints/{ck}/gradients/p{rng.randrange(prompts):07d}", b"")}

    async def run() -> dict:
        out: dict = {}
        for kind, make in kinds.items():
            first = make()
            bodies = {k: await c(*first) for k, c in calls.items()}  # loads the views
            assert len(set(bodies.values())) == 1, f"{kind}: the apps' bodies differ"
            wall: dict[str, list[float]] = {k: [] for k in calls}
            cpu: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(n):
                req = make()
                seen = set()
                for k, c in calls.items():  # alternating, the same request for each
                    t, p = time.perf_counter(), time.process_time()
                    seen.add(await c(*req))
                    cpu[k].append(time.process_time() - p)
                    wall[k].append(time.perf_counter() - t)
                assert len(seen) == 1, f"{kind} {req}: the apps' bodies differ"
            out[kind] = {k: {**percentiles(wall[k]), "cpu_mean_ms": round(float(np.mean(cpu[k])) * 1000, 3)}
                         for k in calls}
            out[kind]["speedup_p50"] = round(out[kind]["old"]["p50_ms"] / out[kind]["new"]["p50_ms"], 2)
        return out

    return asyncio.run(run())


# 2. real servers

def start(root: Path, code: Path, token_file: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """The service in the folder ``code`` (the working tree, or the baseline's) on a port of its own."""
    port = free_port()
    env = {"PYTHONPATH": os.pathsep.join([str(code), str(REPO)])}
    package = "services" if (code / "services").is_dir() else "cropi_service"  # the folder's name before 19
    return start_server(root, port, token_file, log, env, code=code, package=package), f"http://127.0.0.1:{port}"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def servers(root: Path, baseline: Path, ck: str, ranked: int, prompts: int, a: argparse.Namespace) -> dict:
    import httpx

    token_file = a.out / "token"
    token_file.write_text(TOKEN)
    procs = {"old": start(root, baseline, token_file, a.out / "server_old.log"),
             "new": start(root, REPO, token_file, a.out / "server_new.log")}
    pool_ids = [f"p{i:07d}" for i in range(prompts)]
    out: dict = {}
    try:
        rng = random.Random(1)
        reqs = {"ranking_page_1000": lambda: (f"/v1/checkpoints/{ck}/ranking",
                                              {"offset": rng.randrange(0, max(1, ranked - 1000)), "limit": 1000}),
                "gradient_lookup_json": lambda: (f"/v1/checkpoints/{ck}/gradients/{rng.choice(pool_ids)}", None),
                "healthz": lambda: ("/healthz", None)}
        clients = {k: httpx.Client(base_url=b, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
                   for k, (_, b) in procs.items()}
        for c in clients.values():  # load the views
            c.get(f"/v1/checkpoints/{ck}/ranking", params={"limit": 1000}).raise_for_status()
            c.get(f"/v1/checkpoints/{ck}/gradients/{pool_ids[0]}").raise_for_status()
        seq: dict = {}
        for kind, make in reqs.items():
            cpu = {k: 0.0 for k in procs}
            wall: dict[str, list[float]] = {k: [] for k in procs}
            for block in range(a.blocks):
                for k in (("old", "new") if block % 2 == 0 else ("new", "old")):
                    pid = procs[k][0].pid
                    c0 = cpu_seconds(pid)
                    for _ in range(a.block_requests):
                        url, params = make()
                        t = time.perf_counter()
                        clients[k].get(url, params=params).raise_for_status()
                        wall[k].append(time.perf_counter() - t)
                    cpu[k] += cpu_seconds(pid) - c0
            n = a.blocks * a.block_requests
            seq[kind] = {k: {"server_cpu_ms_per_request": round(cpu[k] / n * 1000, 3),
                             "client_round_trip": percentiles(wall[k])} for k in procs}
        for c in clients.values():
            c.close()
        out["sequential_one_client"] = seq
        closed: dict = {k: [] for k in procs}
        for k in ("old", "new", "old", "new"):
            pid = procs[k][0].pid
            c0, p0 = cpu_seconds(pid), time.process_time()
            r = asyncio.run(closed_loop(procs[k][1], TOKEN, [ck], pool_ids, ranked, a.clients, a.duration))
            r["server_cpu_ms_per_request"] = round((cpu_seconds(pid) - c0) / max(1, r["requests"]) * 1000, 3)
            # the load generator's own CPU: on a 2-core machine it competes with the server
            r["client_cpu_ms_per_request"] = round((time.process_time() - p0) / max(1, r["requests"]) * 1000, 3)
            closed[k].append(r)
        out["closed_loop"] = closed
        opened: dict = {}
        for k in ("old", "new"):
            pid = procs[k][0].pid
            c0, p0 = cpu_seconds(pid), time.process_time()
            r = asyncio.run(open_loop(procs[k][1], TOKEN, [ck], pool_ids, ranked, a.clients, a.rate, a.duration))
            r["server_cpu_ms_per_request"] = round((cpu_seconds(pid) - c0) / max(1, r["requests"]) * 1000, 3)
            r["client_cpu_ms_per_request"] = round((time.process_time() - p0) / max(1, r["requests"]) * 1000, 3)
            opened[k] = r
        out["open_loop"] = opened
    finally:
        for proc, _ in procs.values():
            stop_server(proc)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="empty work folder (store, baseline code, logs)")
    p.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "service_hotpath.json")
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the 'old' service")
    p.add_argument("--prompts", type=int, default=5000)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--requests", type=int, default=300, help="in-process requests per kind and app")
    p.add_argument("--blocks", type=int, default=4, help="alternating blocks of sequential requests per server")
    p.add_argument("--block-requests", type=int, default=100)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--duration", type=float, default=6.0, help="seconds of each closed- and open-loop run")
    p.add_argument("--rate", type=float, default=200.0, help="requests/s offered in the open loop")
    p.add_argument("--skip-servers", action="store_true", help="only the in-process comparison")
    a = p.parse_args(argv)
    if a.out.exists() and any(a.out.iterdir()):
        raise SystemExit(f"{a.out} is not empty: give an empty --out")
    a.out.mkdir(parents=True, exist_ok=True)
    root = a.out / "root"
    baseline_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", a.baseline], check=True,
                                  capture_output=True, text=True).stdout.strip()
    new_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=True,
                             capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "cropi_service"], check=True,
                                capture_output=True, text=True).stdout.strip())
    report: dict = {"prompts": a.prompts, "dim": a.dim, "dtype": "float16", "old": f"services at {baseline_rev}",
                    "new": f"cropi_service at {new_rev}" + (" (with uncommitted changes)" if dirty else ""),
                    "machine": platform.platform(), "cpus": os.cpu_count(),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    t = time.perf_counter()
    ck, ranked = build(root, a.prompts, a.dim)
    report["build_s"] = round(time.perf_counter() - t, 1)
    baseline = extract_baseline(a.baseline, a.out / "baseline")
    report["in_process"] = in_process(root, baseline / "pkg", ck, ranked, a.prompts, a.requests,
                                      a.out / "in_process.log")
    if not a.skip_servers:
        report["servers"] = servers(root, baseline, ck, ranked, a.prompts, a)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return write_report(report, a.json, "benchmarks/service_hotpath.py", argv)


if __name__ == "__main__":
    raise SystemExit(main())
