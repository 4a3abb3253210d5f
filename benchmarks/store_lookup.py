"""Gradient lookups that read only what is asked, on a big split: key index, per-lookup latency, bytes read.

    python benchmarks/store_lookup.py --store DIR --name CHECKPOINT [--lookups 2000] [--out FILE]

Opens one split of an existing store (for example the 1M x 8192 store benchmarks/service.py
writes into its --cache) with the library's reader (``cropi.store.SplitReader``: key index from
the keys sidecars, record batches read and verified on demand through one ``PartCache``) and
measures, in this process:

- building the key index (seconds, bytes it holds, the process's RSS before and after);
- single lookups of random prompt ids, first with an empty part cache (each reads and verifies
  one record batch; the file pages may or may not be in the OS cache: both recorded as they
  fell), then the same ids again (answered from the part cache);
- a batch of 100 random ids;
- the bytes read per lookup against the split's size (what a whole-split read took before).

Every returned vector is checked against the row read back from a full, verified read of the
shard that holds it (brute force, another code path). Light enough to run without the heavy lock.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cmdline import command_line  # noqa: E402 (benchmarks/ is the script's folder)
from cropi.store import GradientStore, PartCache, SplitReader  # noqa: E402
from cropi.store import shard_io  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentiles(samples: list[float]) -> dict:
    a = np.asarray(samples) * 1000
    return {"n": len(a), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "max_ms": round(float(a.max()), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", required=True, type=Path)
    p.add_argument("--name", required=True, help="checkpoint name in the store")
    p.add_argument("--split", default="pool")
    p.add_argument("--lookups", type=int, default=2000)
    p.add_argument("--cache-mb", type=float, default=512.0)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "store_lookup.json")
    a = p.parse_args(argv)

    store = GradientStore(str(a.store))
    spec_id = next(s["spec_id"] for s in store.list_splits() if s["checkpoint"] == a.name and s["split"] == a.split)
    split = store.open_split(a.name, spec_id, a.split)
    commits = split.dataset.commits()
    split_bytes = sum(e["bytes"] for es in commits.values() for e in es)
    store_name = "/".join(Path(a.store).parts[-2:])  # the cached store's own folder, not this machine's path
    report: dict = {"store": store_name, "checkpoint": a.name, "split": a.split, "dim": split.dim,
                    "dtype": split.dtype, "split_bytes": split_bytes,
                    "shards": sum(len(es) for es in commits.values()), "cpus": os.cpu_count(),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    read = {"parts": 0, "bytes": 0}
    real_part = shard_io.read_part

    def counted(*args):
        batch = real_part(*args)
        read["parts"] += 1
        read["bytes"] += args[3]["batches"][args[4]][1]
        return batch

    shard_io.read_part = counted
    before = rss_mb()
    t = time.perf_counter()
    reader = SplitReader(split, PartCache(int(a.cache_mb * 2**20)))
    report["index"] = {"seconds": round(time.perf_counter() - t, 2), "prompts": len(reader),
                       "index_bytes": reader.index.nbytes, "rss_before_mb": round(before, 1),
                       "rss_after_mb": round(rss_mb(), 1)}
    rng = random.Random(0)
    ids = [f"p{i:07d}" for i in rng.sample(range(len(reader)), a.lookups)]
    cold, warm = [], []
    for pid in ids:
        t = time.perf_counter()
        got = reader.take([pid])
        cold.append(time.perf_counter() - t)
        assert got.prompt_ids == [pid]
    report["lookup_empty_cache"] = percentiles(cold) | {
        "parts_read": read["parts"], "bytes_read_per_lookup": round(read["bytes"] / a.lookups)}
    for pid in ids:
        t = time.perf_counter()
        reader.take([pid])
        warm.append(time.perf_counter() - t)
    report["lookup_again"] = percentiles(warm) | {"parts_read_in_all": read["parts"],
                                                  "part_cache_bytes": reader.cache.bytes}
    batch_times = []
    for _ in range(20):
        wanted = [f"p{i:07d}" for i in rng.sample(range(len(reader)), 100)]
        t = time.perf_counter()
        reader.take(wanted)
        batch_times.append(time.perf_counter() - t)
    report["batch_100"] = percentiles(batch_times)
    report["rss_end_mb"] = round(rss_mb(), 1)
    report["bytes_read_per_lookup_over_split"] = report["lookup_empty_cache"]["bytes_read_per_lookup"] / split_bytes

    # brute force: 20 looked-up rows against a full verified read of the shard holding each
    shard_io.read_part = real_part
    checked = 0
    for pid in ids[:20]:
        part, row = reader.index.locate(pid)
        entry, writer = reader.index.parts[part].entry, reader.index.parts[part].writer
        whole = split.dataset._load(writer, entry)
        at = whole.column("prompt_id").to_pylist().index(pid)
        want = np.asarray(whole.column("vector")[at].values.to_numpy(zero_copy_only=False))
        assert np.array_equal(reader.take([pid]).vectors[0], want), pid
        checked += 1
    report["checked_against_full_shard_reads"] = checked
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["command"] = command_line("benchmarks/store_lookup.py", argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
