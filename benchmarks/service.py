"""Serving benchmark: ranking pages and gradient lookups from a big synthetic store.

    python benchmarks/service.py --out DIR [--prompts 100000 --dim 8192 --clients 50 --duration 30]

1. Writes ``--prompts`` synthetic pool gradients (float16, length ``--dim``) and two
   validation splits straight into a store with cropi.store's writer, and persists their
   ranking with cropi.pipeline.rank (the same code the scoring job runs).
2. Registers the checkpoint in the service's tables as scored (no model or scoring job: the
   point is serving, not computing).
3. Starts the real server (``python -m cropi_service serve``) on 127.0.0.1 with a token and
   measures, one request at a time: a ranking page of 1,000 (p50/p99 over random offsets,
   the first, cache-filling request reported apart), a single gradient lookup (JSON), and a
   batch of 100 as JSON and as Arrow.
4. An open-loop load: ``--clients`` clients offering ``--rate`` requests/s in total (Poisson
   arrivals), half ranking pages of 1,000 rows and half gradient lookups (JSON), for
   ``--duration`` seconds; latencies count from when a request was due. Then the closed-loop
   maximum: the same clients sending back to back.

Writes benchmarks/results/service.json (``--json``). Goal: under the open-loop load (50 clients,
200 requests/s), ranking page and gradient lookup p99 < 50 ms with zero errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cropi.pipeline.rank import rank  # noqa: E402
from cropi.projection import ProjectionSpec  # noqa: E402
from cropi.store import CheckpointRef, GradientStore  # noqa: E402
from cropi_service.jobs.table import JobStore  # noqa: E402
from cropi_service.domain.registry import CheckpointRow, Registry, new_id  # noqa: E402
from cropi_service.domain.service import scoring_key  # noqa: E402
from cropi_service.base.settings import ServiceSettings  # noqa: E402

NAME = "bench"
VALIDATION = ("gsm", "math")


def write_split(store: GradientStore, spec: ProjectionSpec, split: str, n: int, dim: int, seed: int,
                prefix: str) -> float:
    """``n`` synthetic rows (5% zero_advantage with zero vectors); returns seconds taken.

    One block of standard normal rows is drawn and reused, each row scaled by its own factor:
    the vectors are distinct, and writing 100,000 of them does not wait on the random generator.
    """
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    ref = CheckpointRef(name=NAME, fingerprint="synthetic-benchmark")
    gsplit = store.split(ref, spec.model_dump() | {"spec_id": spec.spec_id}, split, dim=dim, dtype="float16")
    block = rng.standard_normal((min(n, 1024), dim), dtype=np.float32)
    scales = rng.uniform(0.5, 2.0, size=n).astype(np.float32)
    zero = np.zeros(dim, np.float16)
    with gsplit.writer("w0", rows_per_shard=512) as writer:  # the writer checks duplicates per buffered row
        for i in range(n):
            status = "zero_advantage" if i % 20 == 7 else "ok"
            v = (block[i % len(block)] * scales[i]).astype(np.float16) if status == "ok" else zero
            writer.append(f"{prefix}{i:07d}", v, float(scales[i]), 8, 0.5, 0.3, 100 + i % 200, status)
    return time.perf_counter() - start


def register(settings: ServiceSettings, spec_id: str) -> str:
    """A checkpoint row whose scoring job is recorded as succeeded."""
    registry, jobs = Registry(settings.db_path), JobStore(settings.db_path)
    ids = [registry.add_dataset(n, f"/synthetic/{n}.jsonl", "validation", 100).id for n in VALIDATION]
    pool = registry.add_dataset("pool_set", "/synthetic/pool.jsonl", "pool", 0).id
    job = jobs.create("scoring", "builtin", {"name": NAME},
                      key=scoring_key(NAME, spec_id))
    claimed = jobs.claim("benchmark", max_attempts=1)
    jobs.finish(job.id, claimed.attempts, "succeeded", result={"spec_id": spec_id})
    row = CheckpointRow(new_id("ck"), NAME, "/synthetic/model", pool, ids, spec_id, job.id, time.time())
    registry.add_checkpoint(row)
    return row.id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path, port: int, token_file: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "cropi_service", "serve", "--root", str(root), "--port", str(port),
           "--token-file", str(token_file), "--workers", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not come up; see {log}")


def percentiles(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples) * 1000
    return {"n": len(a), "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "max_ms": round(float(a.max()), 2)}


def timed(client, method: str, url: str, **kw) -> tuple[float, object]:
    t = time.perf_counter()
    r = client.request(method, url, **kw)
    elapsed = time.perf_counter() - t
    r.raise_for_status()
    return elapsed, r


def sequential(base: str, token: str, ck: str, pool_ids: list[str], total: int, repeats: int) -> dict:
    import httpx

    rng = random.Random(0)
    out: dict = {}
    # the first requests load the split (1.6 GB at 100,000 x 8192, checksums verified): a long timeout
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=900) as c:
        first, r = timed(c, "GET", f"/v1/checkpoints/{ck}/ranking", params={"limit": 1000})
        out["ranking_first_request_ms"] = round(first * 1000, 1)
        assert len(r.json()["items"]) == 1000
        pages = [timed(c, "GET", f"/v1/checkpoints/{ck}/ranking",
                       params={"offset": rng.randrange(0, total - 1000), "limit": 1000})[0] for _ in range(repeats)]
        out["ranking_page_1000"] = percentiles(pages)
        by_set = [timed(c, "GET", f"/v1/checkpoints/{ck}/ranking",
                        params={"offset": rng.randrange(0, total - 1000), "limit": 1000, "validation": "math"})[0]
                  for _ in range(repeats)]
        out["ranking_page_1000_by_validation_set"] = percentiles(by_set[1:])
        first, _ = timed(c, "GET", f"/v1/checkpoints/{ck}/gradients/{pool_ids[0]}")
        out["gradient_first_request_ms"] = round(first * 1000, 1)
        out["gradient_lookup_json"] = percentiles(
            [timed(c, "GET", f"/v1/checkpoints/{ck}/gradients/{rng.choice(pool_ids)}")[0] for _ in range(repeats)])
        out["gradient_lookup_arrow"] = percentiles(
            [timed(c, "GET", f"/v1/checkpoints/{ck}/gradients/{rng.choice(pool_ids)}",
                   headers={"Accept": "application/vnd.apache.arrow.stream"})[0] for _ in range(repeats)])
        batch = lambda: {"prompt_ids": rng.sample(pool_ids, 100)}  # noqa: E731
        out["gradient_batch_100_json"] = percentiles(
            [timed(c, "POST", f"/v1/checkpoints/{ck}/gradients:batch", json=batch())[0] for _ in range(repeats // 4)])
        out["gradient_batch_100_arrow"] = percentiles(
            [timed(c, "POST", f"/v1/checkpoints/{ck}/gradients:batch", json=batch(),
                   headers={"Accept": "application/vnd.apache.arrow.stream"})[0] for _ in range(repeats // 4)])
    return out


async def _send(c, kind: str, ck: str, rng: random.Random, pool_ids: list[str], total: int):
    if kind == "ranking":
        return await c.get(f"/v1/checkpoints/{ck}/ranking",
                           params={"offset": rng.randrange(0, total - 1000), "limit": 1000})
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


async def open_loop(base: str, token: str, ck: str, pool_ids: list[str], total: int, clients: int,
                    rate: float, duration: float) -> dict:
    """``clients`` clients (one connection each) offering ``rate`` requests/s in total, half ranking
    pages and half gradient lookups, each on its own Poisson schedule. A latency counts from the
    moment the request was due, so time spent queued behind a slow answer is in it (no
    coordinated omission)."""
    import httpx

    latencies: dict[str, list[float]] = {"ranking": [], "gradient": []}
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    conns = _clients(base, token, clients)  # made before the clock starts: a client costs ~20 ms of CPU to make
    start = loop.time() + 0.5
    stop_at = start + duration
    per_client = rate / clients

    async def client(i: int) -> None:
        rng = random.Random(1000 + i)
        async with conns[i] as c:
            due = start + rng.expovariate(per_client)
            while due < stop_at:
                await asyncio.sleep(max(0.0, due - loop.time()))
                kind = "ranking" if rng.random() < 0.5 else "gradient"
                try:
                    r = await _send(c, kind, ck, rng, pool_ids, total)
                    ok, key = r.status_code == 200, str(r.status_code)
                except httpx.HTTPError as e:
                    ok, key = False, type(e).__name__
                if ok:
                    latencies[kind].append(loop.time() - due)
                else:
                    errors[key] = errors.get(key, 0) + 1
                due += rng.expovariate(per_client)

    await asyncio.gather(*(client(i) for i in range(clients)))
    out = _summary(latencies, errors, duration)
    return {"clients": clients, "offered_rps": rate, "duration_s": duration, **out}


async def closed_loop(base: str, token: str, ck: str, pool_ids: list[str], total: int, clients: int,
                      duration: float) -> dict:
    """``clients`` clients each sending its next request as soon as the last one answered: the
    maximum throughput, with the latencies it costs."""
    import httpx

    latencies: dict[str, list[float]] = {"ranking": [], "gradient": []}
    errors: dict[str, int] = {}
    conns = _clients(base, token, clients)
    stop_at = time.monotonic() + duration

    async def client(i: int) -> None:
        rng = random.Random(i)
        async with conns[i] as c:
            while time.monotonic() < stop_at:
                kind = "ranking" if rng.random() < 0.5 else "gradient"
                t = time.perf_counter()
                try:
                    r = await _send(c, kind, ck, rng, pool_ids, total)
                    ok, key = r.status_code == 200, str(r.status_code)
                except httpx.HTTPError as e:
                    ok, key = False, type(e).__name__
                if ok:
                    latencies[kind].append(time.perf_counter() - t)
                else:
                    errors[key] = errors.get(key, 0) + 1

    start = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return {"clients": clients, **_summary(latencies, errors, time.monotonic() - start)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="work folder (the store and server log go here)")
    p.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "service.json")
    p.add_argument("--prompts", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--validation-prompts", type=int, default=100)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rate", type=float, default=200.0, help="requests/s offered in total (open loop)")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--repeats", type=int, default=200, help="sequential requests per measured kind")
    a = p.parse_args(argv)

    root = a.out / "root"
    if root.exists():
        raise SystemExit(f"{root} exists: give an empty --out")
    settings = ServiceSettings(root=root)
    store = GradientStore(str(settings.store))
    spec = ProjectionSpec(dim=a.dim)
    report: dict = {"prompts": a.prompts, "dim": a.dim, "dtype": "float16",
                    "data": "synthetic vectors (standard normal, float16) written with cropi.store's writer; "
                            "ranking computed and persisted by cropi.pipeline.rank. A serving benchmark: no "
                            "model is scored",
                    "machine": platform.platform(), "cpus": os.cpu_count(),
                    "load_generator": "same machine, loopback, httpx async clients (one connection each)",
                    "nice": os.nice(0), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    report["write_pool_s"] = round(write_split(store, spec, "pool", a.prompts, a.dim, 0, "p"), 1)
    for j, v in enumerate(VALIDATION):
        write_split(store, spec, v, a.validation_prompts, a.dim, 1 + j, f"{v}-")
    t = time.perf_counter()
    ranking = rank(str(settings.store), NAME, "pool", list(VALIDATION), top_fraction=0.1, spec_id=spec.spec_id)
    report["rank_and_persist_s"] = round(time.perf_counter() - t, 1)
    ranked = int((ranking.table["rank"].to_numpy() > 0).sum())
    ck = register(settings, spec.spec_id)
    pool_ids = [f"p{i:07d}" for i in range(a.prompts)]

    token = secrets.token_hex(16)
    token_file = a.out / "token"
    token_file.write_text(token)
    port = free_port()
    server = start_server(root, port, token_file, a.out / "server.log")
    base = f"http://127.0.0.1:{port}"
    try:
        report["sequential_one_client"] = sequential(base, token, ck, pool_ids, ranked, a.repeats)
        report["load"] = asyncio.run(open_loop(base, token, ck, pool_ids, ranked, a.clients, a.rate, a.duration))
        report["closed_loop"] = asyncio.run(closed_loop(base, token, ck, pool_ids, ranked, a.clients, a.duration))
        import httpx

        rss = [ln for ln in Path(f"/proc/{server.pid}/status").read_text().splitlines() if ln.startswith("VmRSS")]
        report["server_rss"] = rss[0].split(":", 1)[1].strip() if rss else None
        report["server_ok_after"] = httpx.get(f"{base}/healthz").status_code == 200
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    load = report["load"]
    report["goal"] = "open loop, 50 clients, 200 requests/s offered: ranking page and gradient lookup p99 < 50 ms, " \
                     "zero errors"
    report["goal_met"] = bool(load["errors"] == 0 and load["ranking_page_1000"] and load["gradient_lookup_json"]
                              and load["ranking_page_1000"]["p99_ms"] < 50
                              and load["gradient_lookup_json"]["p99_ms"] < 50)
    return write_report(report, a.json, "benchmarks/service.py", argv)


def write_report(report: dict, path: Path, script: str, argv) -> int:
    """Record the command line in the report, write it as JSON to ``path`` and print it."""
    report["command"] = f"python {script} " + " ".join(argv if argv is not None else sys.argv[1:])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
