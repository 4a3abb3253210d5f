"""Serving benchmark: ranking pages and gradient lookups from a big synthetic store.

    python benchmarks/service.py --out DIR [--cache DIR --prompts 100000 --dim 8192 --checkpoints 3]

1. Writes, for each of ``--checkpoints`` checkpoints, ``--prompts`` synthetic pool gradients
   (float16, length ``--dim``) and two validation splits with cropi.store's shard writer, and
   their ranking (cropi.scoring, saved by cropi.store.rankings), into ``--cache`` once; later
   runs reuse it (1M x 8192 is 16 GB a checkpoint).
2. Registers the checkpoints in the service's tables as scored (no model or scoring job: the
   point is serving, not computing).
3. Starts the real server (``python -m cropi_service serve``) on 127.0.0.1 with a token and
   measures, one request at a time: a ranking page of 1,000 (p50/p99 over random offsets,
   the first, cache-filling request reported apart), a single gradient lookup (JSON), and a
   batch of 100 as JSON and as Arrow.
4. An open-loop load: ``--clients`` clients offering ``--rate`` requests/s in total (Poisson
   arrivals), half ranking pages of 1,000 rows and half gradient lookups (JSON), for
   ``--duration`` seconds, each request to one of the checkpoints at random; latencies count
   from when a request was due. Then the closed-loop maximum: the same clients sending back to
   back. The server's RSS is sampled every 0.1 s throughout (``server_rss_max_mb``).

Writes benchmarks/results/service.json (``--json``). Goal: under the open-loop load (50 clients,
200 requests/s, three checkpoints), ranking page p99 < 50 ms, gradient lookup p99 < 100 ms, zero
errors, server RSS under 2 GB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import secrets
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cmdline import command_line  # noqa: E402 (benchmarks/ is the script's folder)
from serving import (RssSampler, closed_loop, free_port, open_loop, percentiles, start_server,  # noqa: E402
                     stop_server)
from cropi.projection import ProjectionSpec  # noqa: E402
from cropi.store import CheckpointRef, GradientStore  # noqa: E402
from cropi_service.jobs.table import JobStore  # noqa: E402
from cropi_service.domain.registry import CheckpointRow, Registry, new_id  # noqa: E402
from cropi_service.domain.service import scoring_key  # noqa: E402
from cropi_service.base.settings import ServiceSettings  # noqa: E402

NAME = "bench"
VALIDATION = ("gsm", "math")


SHARD_ROWS = 4096  # 64 MB shards at k=8192 in float16; a lookup reads one 256 KB record batch of one


def _pool_table(schema, ids: list[str], vectors: np.ndarray, scales: np.ndarray, status: list[str]):
    import pyarrow as pa

    n, dim = vectors.shape
    cols = {"prompt_id": pa.array(ids, pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim),
            "raw_norm": pa.array(scales.astype(np.float64)), "n_responses": pa.array(np.full(n, 8, np.int32)),
            "reward_mean": pa.array(np.full(n, 0.5)), "reward_std": pa.array(np.full(n, 0.3)),
            "n_tokens": pa.array(100 + np.arange(n, dtype=np.int64) % 200), "status": pa.array(status, pa.string()),
            "ess": pa.array(np.full(n, 6.0)), "ess_fraction": pa.array(np.full(n, 0.75)),
            "p_theta": pa.array(np.full(n, 0.5)), "std_theta": pa.array(np.full(n, 0.3)),
            "log_mean_weight": pa.array(np.zeros(n))}
    return pa.table([cols[f.name] for f in schema], schema=schema)


def _synthetic_rows(rng, block: np.ndarray, start: int, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rows ``start .. start+n``: a block of standard normal rows reused, each row scaled by its own
    factor (distinct vectors without waiting on the random generator); 5% zero_advantage, zero vectors."""
    scales = rng.uniform(0.5, 2.0, size=n).astype(np.float32)
    rows = (block[np.arange(start, start + n) % len(block)] * scales[:, None]).astype(np.float16)
    status = ["zero_advantage" if i % 20 == 7 else "ok" for i in range(start, start + n)]
    rows[[s != "ok" for s in status]] = 0
    return rows, scales, status


def _cosines(vectors: np.ndarray, status: list[str], targets: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``cropi.scoring.influence.cosine_scores`` against each target, the float32 copy and the row
    norms computed once for all targets (same operations in the same order: equal to the bit)."""
    block = vectors.astype(np.float32)
    norms = np.linalg.norm(block, axis=1)
    ok = np.asarray(status) == "ok"
    out = {}
    for name, target in targets.items():
        target = np.asarray(target, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = (block @ target.astype(np.float32)) / (norms * np.linalg.norm(target))
        scores = scores.astype(np.float64)
        scores[~ok | ~np.isfinite(scores)] = np.nan
        out[name] = scores
    return out


def write_checkpoint(store_path: Path, spec: ProjectionSpec, name: str, n: int, n_val: int, dim: int,
                     seed: int) -> dict:
    """One checkpoint's pool (``n`` rows) and validation splits, written through cropi.store's shard
    writer a shard at a time, and its ranking: scored with cropi.scoring while each shard is in memory
    (``cropi.pipeline.rank`` reads a whole split, 16 GB at 1M x 8192) and saved by cropi.store.rankings."""
    from cropi.scoring import Ranking
    from cropi.scoring.fusion import fuse, ranks
    from cropi.scoring.influence import validation_vector
    from cropi.store import rankings

    t0 = time.perf_counter()
    store = GradientStore(str(store_path))
    ref = CheckpointRef(name=name, fingerprint=f"synthetic-benchmark-{seed}")
    spec_d = spec.model_dump() | {"spec_id": spec.spec_id}
    rng = np.random.default_rng(seed)
    block = rng.standard_normal((1024, dim), dtype=np.float32)
    targets = {}
    for j, v in enumerate(VALIDATION):
        split = store.split(ref, spec_d, v, dim=dim, dtype="float16")
        vecs, scales, status = _synthetic_rows(np.random.default_rng(seed * 10 + j + 1), block[::-1], 0, n_val)
        ids = [f"{v}-{i:07d}" for i in range(n_val)]
        split.dataset.writer("w0").commit(_pool_table(split.dataset.schema, ids, vecs, scales, status))
        targets[v] = validation_vector(ids, vecs, status)[0]
    pool = store.split(ref, spec_d, "pool", dim=dim, dtype="float16")
    writer = pool.dataset.writer("w0")
    ids_all, status_all, scores = [], [], {v: [] for v in VALIDATION}
    for start in range(0, n, SHARD_ROWS):
        m = min(SHARD_ROWS, n - start)
        vecs, scales, status = _synthetic_rows(rng, block, start, m)
        ids = [f"p{i:07d}" for i in range(start, start + m)]
        writer.commit(_pool_table(pool.dataset.schema, ids, vecs, scales, status))
        for v, sc in _cosines(vecs, status, targets).items():
            scores[v].append(sc)
        ids_all += ids
        status_all += status
    write_s = time.perf_counter() - t0
    per_set = {v: np.concatenate(s) for v, s in scores.items()}
    fused = fuse(per_set, ids_all, "rrf")
    ranking = Ranking(ids_all, status_all, per_set, fused, ranks(fused, ids_all),
                      {"fusion": "rrf", "max_validation": 100, "seed": 0})
    selected = set(ranking.select(top_fraction=0.1))
    table = ranking.to_table()
    import pyarrow as pa

    table = table.append_column("selected", pa.array([p in selected for p in table["prompt_id"].to_pylist()]))
    meta = ranking.meta | {"checkpoint": name, "spec_id": spec.spec_id, "pool": "pool", "validation": list(VALIDATION),
                           "top_fraction": 0.1, "excluded": ranking.excluded, "checkpoint_fingerprint": ref.fingerprint,
                           "created": time.time()}
    rankings.save(str(store_path), name, spec.spec_id, "pool", table, meta)
    return {"write_s": round(write_s, 1), "rank_and_persist_s": round(time.perf_counter() - t0 - write_s, 1),
            "ranked": int((table["rank"].to_numpy() > 0).sum())}


def build_store(cache: Path, spec: ProjectionSpec, n: int, n_val: int, dim: int, checkpoints: int) -> dict:
    """The store of ``checkpoints`` synthetic checkpoints under ``cache``, written once and reused
    (``done.json`` marks it complete; a half-written one is refused, delete it)."""
    done = cache / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    if cache.exists() and any(cache.iterdir()):
        raise SystemExit(f"{cache} holds a store that was not finished: delete it and rerun")
    built = {f"{NAME}-{c}": write_checkpoint(cache / "store", spec, f"{NAME}-{c}", n, n_val, dim, seed=c)
             for c in range(checkpoints)}
    done.write_text(json.dumps(built, indent=2))
    return built


def register(settings: ServiceSettings, spec_id: str, names: list[str]) -> list[str]:
    """A checkpoint row per name whose scoring job is recorded as succeeded."""
    registry, jobs = Registry(settings.db_path), JobStore(settings.db_path)
    ids = [registry.add_dataset(n, f"/synthetic/{n}.jsonl", "validation", 100).id for n in VALIDATION]
    pool = registry.add_dataset("pool_set", "/synthetic/pool.jsonl", "pool", 0).id
    out = []
    for name in names:
        job = jobs.create("scoring", "builtin", {"name": name}, key=scoring_key(name, spec_id))
        claimed = jobs.claim("benchmark", max_attempts=1)
        jobs.finish(job.id, claimed.attempts, "succeeded", result={"spec_id": spec_id})
        row = CheckpointRow(new_id("ck"), name, "/synthetic/model", pool, ids, spec_id, job.id, time.time())
        registry.add_checkpoint(row)
        out.append(row.id)
    return out


def timed(client, method: str, url: str, **kw) -> tuple[float, object]:
    t = time.perf_counter()
    r = client.request(method, url, **kw)
    elapsed = time.perf_counter() - t
    r.raise_for_status()
    return elapsed, r


def sequential(base: str, token: str, cks: list[str], pool_ids: list[str], total: int, repeats: int) -> dict:
    import httpx

    rng = random.Random(0)
    out: dict = {"ranking_first_request_ms": [], "gradient_first_request_ms": []}
    ck = cks[0]
    # the first requests load each ranking and the split's key index: a long timeout
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=900) as c:
        for one in cks:
            first, r = timed(c, "GET", f"/v1/checkpoints/{one}/ranking", params={"limit": 1000})
            out["ranking_first_request_ms"].append(round(first * 1000, 1))
            assert len(r.json()["items"]) == 1000
            first, _ = timed(c, "GET", f"/v1/checkpoints/{one}/gradients/{pool_ids[0]}")
            out["gradient_first_request_ms"].append(round(first * 1000, 1))
        pages = [timed(c, "GET", f"/v1/checkpoints/{ck}/ranking",
                       params={"offset": rng.randrange(0, total - 1000), "limit": 1000})[0] for _ in range(repeats)]
        out["ranking_page_1000"] = percentiles(pages)
        by_set = [timed(c, "GET", f"/v1/checkpoints/{ck}/ranking",
                        params={"offset": rng.randrange(0, total - 1000), "limit": 1000, "validation": "math"})[0]
                  for _ in range(repeats)]
        out["ranking_page_1000_by_validation_set"] = percentiles(by_set[1:])
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="work folder (the service root and server log go here)")
    p.add_argument("--cache", type=Path, default=None,
                   help="where the synthetic store is written once and reused (default: under --out); "
                        "1M prompts x 8192 x 3 checkpoints is 49 GB: keep it out of the repository")
    p.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "service.json")
    p.add_argument("--prompts", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--checkpoints", type=int, default=3, help="checkpoints served together, requests mixed")
    p.add_argument("--validation-prompts", type=int, default=100)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rate", type=float, default=200.0, help="requests/s offered in total (open loop)")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--closed-duration", type=float, default=None,
                   help="seconds of the closed-loop run (default: --duration; 0 leaves it out)")
    p.add_argument("--repeats", type=int, default=200, help="sequential requests per measured kind")
    p.add_argument("--build-only", action="store_true", help="write the store into --cache and stop")
    a = p.parse_args(argv)

    root = a.out / "root"
    if root.exists():
        raise SystemExit(f"{root} exists: give an empty --out")
    spec = ProjectionSpec(dim=a.dim)
    cache = (a.cache or a.out / "cache") / f"prompts{a.prompts}-dim{a.dim}-ck{a.checkpoints}"
    built = build_store(cache, spec, a.prompts, a.validation_prompts, a.dim, a.checkpoints)
    if a.build_only:
        print(json.dumps(built, indent=2))
        return 0
    root.mkdir(parents=True)
    (root / "store").symlink_to(cache / "store")  # the service reads the library's store under its root
    settings = ServiceSettings(root=root)
    shard_bytes = sum(f.stat().st_size for f in (cache / "store").rglob("*.arrow"))
    report: dict = {"prompts": a.prompts, "dim": a.dim, "dtype": "float16", "checkpoints": a.checkpoints,
                    "vectors_on_disk_gb": round(shard_bytes / 1e9, 1),
                    "data": "synthetic vectors (standard normal rows, float16) written with cropi.store's shard "
                            "writer; rankings scored with cropi.scoring and saved by cropi.store.rankings. A "
                            "serving benchmark: no model is scored",
                    "machine": platform.platform(), "cpus": os.cpu_count(),
                    "load_generator": "same machine, loopback, httpx async clients (one connection each)",
                    "nice": os.nice(0), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                    "store_build": built}
    cks = register(settings, spec.spec_id, list(built))
    ranked = min(b["ranked"] for b in built.values())
    pool_ids = [f"p{i:07d}" for i in range(a.prompts)]

    token = secrets.token_hex(16)
    token_file = a.out / "token"
    token_file.write_text(token)
    port = free_port()
    server = start_server(root, port, token_file, a.out / "server.log")
    rss = RssSampler(server.pid)
    base = f"http://127.0.0.1:{port}"
    try:
        report["sequential_one_client"] = sequential(base, token, cks, pool_ids, ranked, a.repeats)
        report["load"] = asyncio.run(open_loop(base, token, cks, pool_ids, ranked, a.clients, a.rate, a.duration))
        closed = a.duration if a.closed_duration is None else a.closed_duration
        if closed > 0:
            report["closed_loop"] = asyncio.run(closed_loop(base, token, cks, pool_ids, ranked, a.clients, closed))
        import httpx

        report["server_ok_after"] = httpx.get(f"{base}/healthz").status_code == 200
    finally:
        report |= rss.stop()
        stop_server(server)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    load = report["load"]
    report["goal"] = (f"open loop, {a.clients} clients, {a.rate:g} requests/s offered, mixed over {a.checkpoints} "
                      "checkpoints: ranking page p99 < 50 ms, gradient lookup p99 < 100 ms, zero errors, "
                      "server RSS < 2 GB throughout")
    report["goal_met"] = bool(load["errors"] == 0 and load["ranking_page_1000"] and load["gradient_lookup_json"]
                              and load["ranking_page_1000"]["p99_ms"] < 50
                              and load["gradient_lookup_json"]["p99_ms"] < 100
                              and report["server_rss_max_mb"] < 2048)
    return write_report(report, a.json, "benchmarks/service.py", argv)


def write_report(report: dict, path: Path, script: str, argv) -> int:
    """Record the command line in the report, write it as JSON to ``path`` and print it."""
    report["command"] = command_line(script, argv)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
