"""What reading gradient shards into owned, checksum-verified memory costs against the old
zero-copy memory map, side by side on one split.

    python benchmarks/shard_read.py --out benchmarks/results            # 4,096 prompts at k=8192, float16

Three ways to turn a split's shard files into tables, each timed ``--repeats`` times in
turn (files warm in the page cache after the first round, as in a serving process):

- ``mmap_unverified``: the old reader after its first read (memory map, checksum skipped
  because a (path, size, mtime) stamp said "verified before"). Unsafe: an in-place edit is
  served, a truncation is SIGBUS.
- ``mmap_hashed``: the old reader's first read (hash the file, then memory-map it).
- ``owned_verified``: today's reader (``shard_io.load_shard``): read each shard into owned
  memory, hash those bytes, parse them, check rows and key range.
- ``split_read``: the whole of ``GradientSplit.read`` on top of that (de-duplication across
  writers, concatenation, the GradientTable), for scale.

Writes OUT/shard_read.json with the medians and the ratio owned_verified / mmap_unverified.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from cmdline import command_line  # noqa: E402 (benchmarks/ is the script's folder)
from cropi.store import CheckpointRef, GradientStore
from cropi.store.shard_io import load_shard, shard_path
from cropi.utils.fsio import sha256_file


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for shard_read.json")
    p.add_argument("--prompts", type=int, default=4096)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--rows-per-shard", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    return p.parse_args(argv)


def build(root: str, prompts: int, dim: int, rows_per_shard: int):
    split = GradientStore(root).split(CheckpointRef(name="bench", fingerprint="f"), {"spec_id": "s"}, "pool",
                                      dim=dim, dtype="float16")
    rng = np.random.default_rng(0)
    with split.writer("w0", rows_per_shard=rows_per_shard) as w:
        for i in range(prompts):
            w.append(f"p{i:07d}", rng.standard_normal(dim).astype(np.float16), 1.0, 8, 0.5, 0.5, 100, "ok")
    return split


def read_mmap(split, hashed: bool) -> int:
    ds = split.dataset
    rows = 0
    for writer_id, entries in ds.commits().items():
        for e in entries:
            path = shard_path(ds.path, e["file"])
            if hashed:
                assert sha256_file(ds.fs, path) == e["sha256"]
            rows += pa.ipc.open_file(pa.memory_map(path)).read_all().num_rows
    return rows


def read_owned(split) -> int:
    ds = split.dataset
    return sum(load_shard(ds.fs, ds.path, w, e, ds.fmt, ds.key).num_rows
               for w, entries in ds.commits().items() for e in entries)


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        split = build(tmp, args.prompts, args.dim, args.rows_per_shard)
        ways = {"mmap_unverified": lambda: read_mmap(split, False),
                "mmap_hashed": lambda: read_mmap(split, True),
                "owned_verified": lambda: read_owned(split),
                "split_read": lambda: len(split.read())}
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(args.repeats):
            for name, fn in ways.items():
                t0 = time.perf_counter()
                assert fn() == args.prompts
                times[name].append(time.perf_counter() - t0)
        nbytes = sum(e["bytes"] for es in split.dataset.commits().values() for e in es)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "benchmark": "shard_read",
        "command": command_line("benchmarks/shard_read.py", argv),
        "prompts": args.prompts, "dim": args.dim, "dtype": "float16", "rows_per_shard": args.rows_per_shard,
        "store_bytes": nbytes, "repeats": args.repeats,
        "seconds": times, "median_s": med,
        "gb_per_s": {k: nbytes / v / 1e9 for k, v in med.items()},
        "ratio_owned_verified_to_mmap_unverified": med["owned_verified"] / med["mmap_unverified"],
        "ratio_owned_verified_to_mmap_hashed": med["owned_verified"] / med["mmap_hashed"],
        "machine": {"python": platform.python_version(), "processor": platform.processor(),
                    "pyarrow": pa.__version__},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "shard_read.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_s", "gb_per_s", "ratio_owned_verified_to_mmap_unverified")},
                     indent=1))
    return result


if __name__ == "__main__":
    main()
