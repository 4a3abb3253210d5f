"""The service's bounds under attack (issue 26): stalled readers beside the usual load, and ranking
pages cycling many checkpoints.

    python benchmarks/service_bounds.py --out DIR [--cache DIR --prompts 100000 --dim 2048]

Uses benchmarks/service.py's synthetic store (``--checkpoints`` 3, written once into ``--cache``) and
starts the real server (``python -m cropi_service serve``, settings by CROPI_SERVICE_* variables) on
127.0.0.1 with three tokens: the well-behaved clients', the stalled readers' and the batch clients'.

1. **Stalled readers** (``--stalled``, 48): each opens a connection, POSTs a ``--batch``-id Arrow
   gradients batch (10,000, or as many as max_response_mb allows) and never reads the answer; every
   ``stall_timeout_s`` + 1 s it does it again on a new connection (an attacker that keeps at it).
   Beside them: the usual open loop (``--clients`` 50 at ``--rate`` 200 requests/s, half ranking
   pages of 1,000, half gradient lookups, over the three checkpoints: benchmarks/serving.py) and a
   ``/healthz`` probe every 20 ms on its own connection, in a process of its own (as are the
   attackers: the load generator's work must not delay the probe). Then ``--batch-clients`` clients (60) that
   send 10k-id Arrow batches back to back and read them (issue 26's W2), in a second phase beside the
   same load and probe. Latencies count from when a request was due. The server's RSS is sampled
   every 0.1 s.
   Goal: the well-behaved clients see no error, /healthz p99 < 50 ms, server RSS < 2 GB.
2. **Checkpoints cycled** (``--cycle 1,17,50,100``): the first checkpoint's ranking linked under
   100 names, each registered as a checkpoint, served with the default budgets and again with each
   ``--budgets NAME:RANKING_CACHE_MB:RANKING_VIEWS_MB`` (default ``sized:2560:1024``, room for 100
   rankings of 100k prompts; a small pair shows a budget exceeded at a small scale). For
   each count: every ranking's first page (loads), then ``--repeats`` pages of 1,000 at random offsets
   cycling the checkpoints in turn, one client. Goal: p99 at 50 within 3x of one checkpoint's, or the
   bytes budget that is exceeded named in the JSON.
3. **Looping batches alone** (``--looping-batches``, issue 31): ``--batch-clients`` (60) clients sending
   ``--batch``-id (10,000) Arrow batches back to back and reading them, with the ``/healthz`` probe and
   no other load, for ``--duration`` s; with ``--baseline-code DIR`` the same again against a server run
   from DIR (a checkout of an earlier commit). Goal: /healthz p99 < 50 ms. Recorded under
   ``looping_batches`` in ``--json``, whose other keys are kept; nothing else runs.

Writes benchmarks/results/service_bounds.json (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import service as bench  # noqa: E402 (benchmarks/service.py: the synthetic store)
from serving import RssSampler, free_port, open_loop, percentiles, start_server, stop_server  # noqa: E402
from cropi.projection import ProjectionSpec  # noqa: E402
from cropi_service.base.settings import ServiceSettings  # noqa: E402
from cropi_service.domain.views import record_bytes_bound  # noqa: E402

ARROW = "application/vnd.apache.arrow.stream"


def server_bounds(base: str, token: str) -> dict:
    """The server's caches and answers in flight, from /metrics."""
    import httpx

    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    out: dict = {}
    for name, cache, value in re.findall(r'^(cropi_cache_\w+)\{cache="(\w+)"\} (\S+)$', text, re.M):
        out.setdefault(cache, {})[name.removeprefix("cropi_cache_")] = float(value)
    return {k: {"mb": round(v.get("bytes", 0) / 2**20, 1), "budget_mb": round(v.get("budget_bytes", 0) / 2**20, 1),
                "entries": int(v.get("entries", 0))} for k, v in out.items()}


def server_histogram(base: str, token: str) -> dict[str, dict[float, float]]:
    """The server's own request durations (/metrics, by route, all statuses): cumulative counts by bucket."""
    import httpx

    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    out: dict[str, dict[float, float]] = {}
    pattern = r'^cropi_http_request_duration_seconds_bucket\{le="([^"]+)",method="\w+",route="([^"]+)",status="\d+"\} (\S+)$'
    for le, route, n in re.findall(pattern, text, re.M):
        buckets = out.setdefault(route, {})
        buckets[float(le)] = buckets.get(float(le), 0.0) + float(n)
    return out


def server_side(before: dict, after: dict) -> dict:
    """Per route, the requests between two scrapes and the bucket bounds their p50 and p99 fall under: the
    time the server itself took, without the time a request waited to be read or the client to run."""
    out = {}
    for route, buckets in after.items():
        delta = {le: n - before.get(route, {}).get(le, 0.0) for le, n in buckets.items()}
        total = delta.get(float("inf"), 0.0)
        if total <= 0:
            continue
        bound = lambda q: next(le for le in sorted(delta) if delta[le] >= q * total)  # noqa: E731
        out[route] = {"n": int(total), "p50_at_most_ms": bound(0.5) * 1000, "p99_at_most_ms": bound(0.99) * 1000}
    return out


# 1. stalled readers

async def stalled_reader(port: int, token: str, path: str, body: bytes, stop_at: float, every: float,
                         held: list, counts: dict) -> None:
    """Sends a batch and never reads; again on a new connection every ``every`` seconds."""
    loop = asyncio.get_running_loop()
    head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nAccept: {ARROW}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    while loop.time() < stop_at:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes as little as the kernel allows
        s.setblocking(False)
        try:
            await loop.sock_connect(s, ("127.0.0.1", port))
            await loop.sock_sendall(s, head + body)
            counts["sent"] += 1
        except OSError as e:
            counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
        held.append(s)  # kept open, never read: closed only by the server (or at the end)
        await asyncio.sleep(min(every, max(0.0, stop_at - loop.time())))


async def healthz_probe(base: str, stop_at: float, every: float = 0.02) -> dict:
    import httpx

    loop = asyncio.get_running_loop()
    took, errors = [], {}
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        due = loop.time()
        while due < stop_at:
            await asyncio.sleep(max(0.0, due - loop.time()))
            try:
                r = await c.get("/healthz")
                if r.status_code == 200:
                    took.append(loop.time() - due)
                else:
                    errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
            except httpx.HTTPError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            due += every
    return {"every_ms": every * 1000, **percentiles(took), "errors": errors}


async def batch_client(base: str, token: str, ck_ids: list[str], pool_ids: list[str], batch: int, stop_at: float,
                       statuses: dict, seed: int) -> None:
    """Sends Arrow batches back to back and reads them; a 429/503 is waited out as Retry-After says."""
    import httpx

    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=base, timeout=120, headers={"Authorization": f"Bearer {token}",
                                                                      "Accept": ARROW}) as c:
        while loop.time() < stop_at:
            try:
                r = await c.post(f"/v1/checkpoints/{rng.choice(ck_ids)}/gradients:batch",
                                 json={"prompt_ids": rng.sample(pool_ids, batch)})
                key = str(r.status_code)
                if r.status_code in (429, 503):
                    await asyncio.sleep(min(float(r.headers.get("Retry-After", 1)), max(0.0, stop_at - loop.time())))
            except httpx.HTTPError as e:
                key = type(e).__name__
            statuses[key] = statuses.get(key, 0) + 1


async def attackers(port: int, base: str, tokens: dict[str, str], cks: list[str], pool_ids: list[str], batch: int,
                    stall_s: float, stalled: int, batch_clients: int, start_wall: float, stop_wall: float) -> dict:
    """The stalled readers and the batch clients, from ``start_wall`` to ``stop_wall`` (time.time())."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_wall - time.time()))
    stop_at = loop.time() + (stop_wall - time.time())
    body = json.dumps({"prompt_ids": pool_ids[:batch]}).encode()
    held: list[socket.socket] = []
    counts = {"sent": 0}
    statuses: dict[str, int] = {}
    readers = [stalled_reader(port, tokens["stalled"], f"/v1/checkpoints/{cks[i % len(cks)]}/gradients:batch", body,
                              stop_at, stall_s + 1.0, held, counts) for i in range(stalled)]
    batches = [batch_client(base, tokens["batch"], cks, pool_ids, batch, stop_at, statuses, i)
               for i in range(batch_clients)]
    await asyncio.gather(*readers, *batches)
    for s in held:
        s.close()
    out: dict = {}
    if stalled:
        out |= {"stalled_readers": stalled, "stalled_requests_sent": counts}
    if batch_clients:
        out |= {"batch_clients": batch_clients, "batch_clients_statuses": statuses}
    return out


async def probe(base: str, start_wall: float, stop_wall: float) -> dict:
    await asyncio.sleep(max(0.0, start_wall - time.time()))
    return await healthz_probe(base, asyncio.get_running_loop().time() + (stop_wall - time.time()))


def _child(name: str, args: tuple, results) -> None:
    """A spawned process running one side of the load in its own event loop: the load generator's
    own work (reading 60 clients' batches in Python) must not delay the health probe's timings."""
    results.put(asyncio.run({"attackers": attackers, "probe": probe}[name](*args)))


def attack(base: str, port: int, tokens: dict[str, str], cks: list[str], pool_ids: list[str], total: int,
           a: argparse.Namespace, batch: int, stall_s: float, stalled: int, batch_clients: int,
           load: bool = True) -> dict:
    """Attackers and the /healthz probe each in a process of their own, the open loop (``load``) in this one."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 5.0  # the children import and connect first
    stop = start + 1.0 + a.duration + 0.5
    queues = {name: ctx.Queue() for name in ("attackers", "probe")}
    procs = [ctx.Process(target=_child, args=("attackers", (port, base, tokens, cks, pool_ids, batch, stall_s, stalled,
                                                            batch_clients, start, stop), queues["attackers"])),
             ctx.Process(target=_child, args=("probe", (base, start + 1.0, stop), queues["probe"]))]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start + 1.0 - time.time()))  # the attackers' first batches are in before the load
    if load:
        load = asyncio.run(open_loop(base, tokens["good"], cks, pool_ids, total, a.clients, a.rate, a.duration))
    else:  # the batch clients and the probe alone
        time.sleep(max(0.0, stop - time.time()))
        load = None
    out = {"load": load, "healthz": queues["probe"].get(timeout=600), **queues["attackers"].get(timeout=600)}
    for p in procs:
        p.join(60)
    return out


def stalled_phase(a: argparse.Namespace, cache: Path, built: dict, spec: ProjectionSpec, env: dict,
                  phases: tuple | None = None, label: str = "stalled", code: Path = REPO) -> dict:
    """One server (run from ``code``), then each of ``phases`` against it in turn: (name, stalled readers,
    batch clients, with the open loop). Default: the stalled readers, then the queued batches, each beside
    the open loop."""
    phases = phases or (("stalled_readers", a.stalled, 0, True), ("queued_batches", 0, a.batch_clients, True))
    root = a.out / f"root-{label}"
    root.mkdir(parents=True)
    (root / "store").symlink_to(cache / "store")
    settings = ServiceSettings(root=root, **{k.removeprefix("CROPI_SERVICE_").lower(): v for k, v in env.items()})
    cks = bench.register(settings, spec.spec_id, list(built))
    ranked = min(b["ranked"] for b in built.values())
    pool_ids = [f"p{i:07d}" for i in range(a.prompts)]
    fits = int(settings.max_response_mb * 2**20) // record_bytes_bound(a.dim, "float16", True)
    batch = min(a.batch, fits, a.prompts)
    tokens = {k: secrets.token_hex(16) for k in ("good", "stalled", "batch")}
    token_file = a.out / f"tokens-{label}"
    token_file.write_text("\n".join(tokens.values()) + "\n")
    port = free_port()
    server = start_server(root, port, token_file, a.out / f"server-{label}.log", env, code=code)
    rss = RssSampler(server.pid)
    base = f"http://127.0.0.1:{port}"
    out: dict = {"batch_ids": batch, "batch_arrow_mb": round(batch * a.dim * 2 / 2**20, 1),
                 "settings": {k: getattr(settings, k) for k in (
                     "answer_memory_mb", "answer_memory_mb_per_caller", "max_response_mb", "heavy_requests",
                     "heavy_queue", "heavy_wait_s", "stall_timeout_s", "max_connections", "ranking_cache_mb",
                     "ranking_views_mb", "gradient_cache_mb", "gradient_views_mb", "render_cache_mb",
                     "switch_interval_ms", "freeze_startup_heap")}}
    try:
        import httpx

        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {tokens['good']}"}, timeout=900) as c:
            warm = time.perf_counter()
            for ck in cks:  # the usual benchmark's first requests: each ranking and split loaded
                c.get(f"/v1/checkpoints/{ck}/ranking", params={"limit": 1000}).raise_for_status()
                c.get(f"/v1/checkpoints/{ck}/gradients/{pool_ids[0]}").raise_for_status()
            out["warm_s"] = round(time.perf_counter() - warm, 1)
        out["rss_before_attack_mb"] = round(rss.samples[-1], 1) if rss.samples else None
        # the goal: stalled readers beside the usual load; then issue 26's W2, batch clients reading their
        # answers beside the same load; each with the /healthz probe
        for name, stalled, batch_clients, load in phases:
            first = len(rss.samples)
            histogram = server_histogram(base, tokens["good"])
            phase = attack(base, port, tokens, cks, pool_ids, ranked, a, batch, settings.stall_timeout_s, stalled,
                           batch_clients, load)
            samples = rss.samples[first:] or [0.0]
            phase["server_rss_max_mb"] = round(max(samples), 1)
            phase["server_side"] = server_side(histogram, server_histogram(base, tokens["good"]))
            phase["bounds_after"] = server_bounds(base, tokens["good"])
            out[name] = phase
            time.sleep(2.0)  # the attackers' connections closed, their answers freed
        out["server_ok_after"] = httpx.get(f"{base}/healthz").status_code == 200
    finally:
        out |= rss.stop()
        stop_server(server)
    return out


# 2. checkpoints cycled

def link_rankings(store: Path, source: str, names: list[str]) -> None:
    """``source``'s stored ranking under each of ``names`` (hard links: the files, once on disk)."""
    src = store / "rankings" / source
    for name in names:
        dst = store / "rankings" / name
        if not dst.exists():
            shutil.copytree(src, dst, copy_function=os.link)


def cycle_run(a: argparse.Namespace, cache: Path, spec: ProjectionSpec, names: list[str], ranked: int,
              label: str, env: dict) -> dict:
    root = a.out / f"root-cycle-{label}"
    root.mkdir(parents=True)
    (root / "store").symlink_to(cache / "store")
    settings = ServiceSettings(root=root, **{k.removeprefix("CROPI_SERVICE_").lower(): v for k, v in env.items()})
    cks = bench.register(settings, spec.spec_id, names)
    token = secrets.token_hex(16)
    (a.out / f"token-{label}").write_text(token)
    port = free_port()
    server = start_server(root, port, a.out / f"token-{label}", a.out / f"server-cycle-{label}.log", env)
    rss = RssSampler(server.pid)
    base = f"http://127.0.0.1:{port}"
    out: dict = {"settings": {"ranking_cache_mb": settings.ranking_cache_mb,
                              "ranking_views_mb": settings.ranking_views_mb}, "by_checkpoints": {}}
    try:
        import httpx

        rng = random.Random(0)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=900) as c:
            for n in a.cycle:
                first = []
                for ck in cks[:n]:  # every ranking's first page: loads it (and encodes its order)
                    t = time.perf_counter()
                    c.get(f"/v1/checkpoints/{ck}/ranking", params={"limit": 1000}).raise_for_status()
                    first.append(time.perf_counter() - t)
                took = []
                for i in range(a.repeats):
                    t = time.perf_counter()
                    r = c.get(f"/v1/checkpoints/{cks[i % n]}/ranking",
                              params={"offset": rng.randrange(0, ranked - 1000), "limit": 1000})
                    took.append(time.perf_counter() - t)
                    r.raise_for_status()
                out["by_checkpoints"][str(n)] = {"ranking_page_1000": percentiles(took),
                                                 "first_pages": percentiles(first),
                                                 "bounds": server_bounds(base, token)}
    finally:
        out |= rss.stop()
        stop_server(server)
    return out


def cycle_phase(a: argparse.Namespace, cache: Path, built: dict, spec: ProjectionSpec) -> dict:
    store = cache / "store"
    names = [f"cycle-{i:03d}" for i in range(max(a.cycle))]
    link_rankings(store, next(iter(built)), names)
    ranked = next(iter(built.values()))["ranked"]
    runs = {"default_budgets": cycle_run(a, cache, spec, names, ranked, "default", {})}
    for budget in a.budgets:
        label, pages_mb, views_mb = budget.split(":")
        runs[f"{label}_budgets"] = cycle_run(a, cache, spec, names, ranked, label, {
            "CROPI_SERVICE_RANKING_CACHE_MB": pages_mb, "CROPI_SERVICE_RANKING_VIEWS_MB": views_mb})
    # what one checkpoint's ranking takes in each budget, from the one-checkpoint step
    for run in runs.values():
        one = run["by_checkpoints"][str(min(a.cycle))]["bounds"]
        run["per_checkpoint_mb"] = {"ranking_pages": one["ranking_pages"]["mb"] / min(a.cycle),
                                    "ranking_views": one["ranking_views"]["mb"] / min(a.cycle)}
        for n, step in run["by_checkpoints"].items():
            over = []
            for cache_name, setting in (("ranking_pages", "ranking_cache_mb"), ("ranking_views", "ranking_views_mb")):
                need = run["per_checkpoint_mb"][cache_name] * int(n)
                if need > step["bounds"][cache_name]["budget_mb"]:
                    over.append(f"{setting}: {int(n)} rankings take {need:.1f} MB, the budget is "
                                f"{step['bounds'][cache_name]['budget_mb']:.1f} MB")
            step["budget_exceeded"] = over or None
    return runs


# 3. looping batches alone (issue 31, item 12)

def looping_run(a: argparse.Namespace, cache: Path, built: dict, spec: ProjectionSpec, env: dict, label: str,
                code: Path) -> dict:
    """The batch clients and the /healthz probe alone against a server run from ``code``: the figures."""
    run = stalled_phase(a, cache, built, spec, env, (("looping_batches", 0, a.batch_clients, False),), label, code)
    phase = run["looping_batches"]
    served = phase["batch_clients_statuses"].get("200", 0)
    return {"healthz_p99_ms": phase["healthz"]["p99_ms"], "healthz": phase["healthz"],
            "batches_served": served, "batches_per_s": round(served / a.duration, 2),
            "batch_clients_statuses": phase["batch_clients_statuses"],
            "server_rss_max_mb": phase["server_rss_max_mb"], "server_side": phase["server_side"],
            "batch_ids": run["batch_ids"], "batch_arrow_mb": run["batch_arrow_mb"], "settings": run["settings"]}


def looping_batches(a: argparse.Namespace, cache: Path, built: dict, spec: ProjectionSpec, env: dict,
                    argv: list[str] | None, loadavg_at_start: list[float]) -> dict:
    """``--looping-batches``: the server from this checkout, and from ``--baseline-code`` when given."""
    from cmdline import command_line

    out: dict = {"scenario": (f"{a.batch_clients} clients each sending {a.batch}-id Arrow gradient batches back "
                              "to back and reading them, no other load; /healthz probed every 20 ms from a "
                              "process of its own"),
                 "command": command_line("benchmarks/service_bounds.py", argv),
                 **({"note": a.note} if a.note else {}),
                 "machine": platform.platform(), "cpus": os.cpu_count(), "nice": os.nice(0),
                 "loadavg_at_start": loadavg_at_start,
                 "loadavg_before_server": [round(x, 2) for x in os.getloadavg()],
                 "prompts": a.prompts, "dim": a.dim, "dtype": "float16", "checkpoints": a.checkpoints,
                 "duration_s": a.duration, "goal": "/healthz p99 < 50 ms"}
    out |= looping_run(a, cache, built, spec, env, "looping", REPO)
    out["goal_met"] = out["healthz_p99_ms"] < 50
    if a.baseline_code is not None:
        time.sleep(2.0)
        base = looping_run(a, cache, built, spec, env, "looping-baseline", a.baseline_code.resolve())
        out["baseline"] = {"code": a.baseline_label or str(a.baseline_code), **base}
    out["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="work folder (service roots, server logs)")
    p.add_argument("--cache", type=Path, default=None, help="where the synthetic store is written once and reused")
    p.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "service_bounds.json")
    p.add_argument("--prompts", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=2048, help="k: at 2048 a 10k-id Arrow batch (41 MB) is legal")
    p.add_argument("--checkpoints", type=int, default=3)
    p.add_argument("--validation-prompts", type=int, default=100)
    p.add_argument("--stalled", type=int, default=48)
    p.add_argument("--batch", type=int, default=10_000, help="ids a stalled reader's / batch client's batch asks for")
    p.add_argument("--batch-clients", type=int, default=60)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--cycle", type=lambda s: [int(x) for x in s.split(",")], default=[1, 17, 50, 100])
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--budgets", action="append", default=None,
                   help="NAME:RANKING_CACHE_MB:RANKING_VIEWS_MB, a second server for the cycle (repeatable; "
                        "default sized:2560:1024)")
    p.add_argument("--skip", choices=["stalled", "cycle"], action="append", default=[])
    p.add_argument("--note", default=None, help="a line kept in the JSON (how the machine was, why this scale)")
    p.add_argument("--server-env", action="append", default=[], metavar="CROPI_SERVICE_X=V",
                   help="a setting of the stalled-readers server (repeatable)")
    p.add_argument("--looping-batches", action="store_true",
                   help="only --batch-clients clients looping on --batch-id Arrow batches, with the /healthz probe "
                        "and no other load, for --duration s; recorded under 'looping_batches' in --json, whose "
                        "other keys are kept")
    p.add_argument("--baseline-code", type=Path, default=None,
                   help="with --looping-batches: the same scenario against a server run from this folder (a "
                        "checkout of an earlier commit), recorded under 'baseline'")
    p.add_argument("--baseline-label", default=None, help="what --baseline-code is (for example its commit)")
    a = p.parse_args(argv)
    a.budgets = a.budgets or ["sized:2560:1024"]
    if a.out.exists() and any(a.out.iterdir()):
        raise SystemExit(f"{a.out} is not empty: give an empty --out")
    a.out.mkdir(parents=True, exist_ok=True)
    spec = ProjectionSpec(dim=a.dim)
    cache = (a.cache or a.out / "cache") / f"prompts{a.prompts}-dim{a.dim}-ck{a.checkpoints}"
    report: dict = {**({"note": a.note} if a.note else {}), "prompts": a.prompts, "dim": a.dim, "dtype": "float16", "checkpoints": a.checkpoints,
                    "machine": platform.platform(), "cpus": os.cpu_count(), "nice": os.nice(0),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                    "load_generator": "same machine, loopback: httpx async clients and raw sockets"}
    t = time.perf_counter()
    built = bench.build_store(cache, spec, a.prompts, a.validation_prompts, a.dim, a.checkpoints)
    report["store_build_s"] = round(time.perf_counter() - t, 1)
    if a.looping_batches:
        env = dict(kv.split("=", 1) for kv in a.server_env)
        figures = looping_batches(a, cache, built, spec, env, argv, report["loadavg_at_start"])
        kept = json.loads(a.json.read_text()) if a.json.exists() else {}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({**kept, "looping_batches": figures}, indent=2) + "\n")
        print(json.dumps(figures, indent=2))
        return 0
    if "stalled" not in a.skip:
        env = dict(kv.split("=", 1) for kv in a.server_env)
        report["stalled"] = stalled_phase(a, cache, built, spec, env)
        s = report["stalled"]["stalled_readers"]
        report["stalled_readers"] = a.stalled
        report["healthz_p99_ms"] = s["healthz"]["p99_ms"]
        report["server_rss_max_mb"] = s["server_rss_max_mb"]
        report["well_behaved_errors"] = s["load"]["errors"]
        q = report["stalled"]["queued_batches"]
        report["queued_batches"] = {"batch_clients": a.batch_clients, "healthz_p99_ms": q["healthz"]["p99_ms"],
                                    "well_behaved_errors": q["load"]["errors"],
                                    "server_rss_max_mb": q["server_rss_max_mb"]}
    if "cycle" not in a.skip:
        report["cycled"] = cycle_phase(a, cache, built, spec)
        default = report["cycled"]["default_budgets"]["by_checkpoints"]
        report["checkpoints_cycled"] = max(a.cycle)
        report["ranking_p99_ms_cycled"] = {run: {n: step["ranking_page_1000"]["p99_ms"]
                                                 for n, step in report["cycled"][run]["by_checkpoints"].items()}
                                           for run in report["cycled"]}
        fifty = str(50 if 50 in a.cycle else max(a.cycle))
        one = str(min(a.cycle))
        p99 = lambda run, n: run[n]["ranking_page_1000"]["p99_ms"]  # noqa: E731
        report["cycle_goal"] = {
            "at": int(fifty), "p99_ms": p99(default, fifty), "one_checkpoint_p99_ms": p99(default, one),
            "within_3x": p99(default, fifty) <= 3 * p99(default, one),
            "budget_exceeded": default[fifty]["budget_exceeded"]}
        for run, steps in report["cycled"].items():
            if run != "default_budgets":
                report["cycle_goal"][run] = {"within_3x": p99(steps["by_checkpoints"], fifty)
                                             <= 3 * p99(steps["by_checkpoints"], one),
                                             "budget_exceeded": steps["by_checkpoints"][fifty]["budget_exceeded"]}
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    goals = []
    if "stalled" in report:
        goals.append(report["well_behaved_errors"] == 0 and report["healthz_p99_ms"] < 50
                     and report["server_rss_max_mb"] < 2048)
        report["stalled_goal"] = (f"{a.stalled} stalled readers of {report['stalled']['batch_ids']}-id Arrow batches "
                                  f"beside the open loop ({a.clients} clients, {a.rate:g}/s): 0 errors for the open "
                                  "loop, /healthz p99 < 50 ms, server RSS < 2 GB")
    if "cycle_goal" in report:
        g = report["cycle_goal"]
        goals.append(bool(g["within_3x"] or g["budget_exceeded"]))
    report["goal_met"] = all(goals) if goals else None
    return bench.write_report(report, a.json, "benchmarks/service_bounds.py", argv)


if __name__ == "__main__":
    raise SystemExit(main())
