"""Seconds per ``project`` call: 16 vectors of 2**20 coordinates, several specs.

    python benchmarks/projection_speed.py --out DIR [--device cpu] [--repeats 5]

Writes DIR/projection_speed.json: one row per case with the first call (which
builds and caches plans when caching is on) and the mean of the later calls.
Dense gaussian runs at k=1024 only and once per case: it regenerates k
entries per kept coordinate on every call.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from cropi.projection import ProjectionSpec, make_projector

N_VECTORS, N_COORDS = 16, 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_case(spec: ProjectionSpec, grads: torch.Tensor, device: torch.device, cache: bool, repeats: int) -> dict:
    """Build a projector and time its first and later calls."""
    proj = make_projector(spec, {"w": (1024, 1024)}, device=device, cache=cache)
    named = [("w", grads)]
    t0 = time.perf_counter()
    proj.project(named)
    _sync(device)
    first = time.perf_counter() - t0
    later = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proj.project(named)
        _sync(device)
        later.append(time.perf_counter() - t0)
    mean = sum(later) / len(later) if later else None
    return {"kind": spec.kind, "dim": spec.dim, "kept_fraction": spec.kept_fraction, "nnz": spec.nnz,
            "cache": cache, "cache_mib": round(proj.cache_bytes / 2**20, 1), "n_kept": proj.n_kept, "first_call_s": round(first, 4),
            "seconds_per_call": round(mean, 4) if mean is not None else round(first, 4), "repeats": len(later)}


def cases(dense: bool = True) -> list[tuple[ProjectionSpec, bool, bool]]:
    """(spec, cache, slow) for every measured case."""
    out = []
    for dim in (1024, 32768):
        for fraction in (1.0, 0.1):
            for nnz in (1, 4):
                for cache in (True, False):
                    out.append((ProjectionSpec(kind="sjlt", dim=dim, kept_fraction=fraction, nnz=nnz), cache, False))
    for fraction in (1.0, 0.1) if dense else ():
        out.append((ProjectionSpec(kind="gaussian", dim=1024, kept_fraction=fraction), True, True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder for projection_speed.json")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the first (fast cases)")
    parser.add_argument("--no-dense", action="store_true", help="skip the (slow) dense gaussian cases")
    args = parser.parse_args()
    device = torch.device(args.device)
    grads = torch.randn(N_VECTORS, 1024, 1024, generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for spec, cache, slow in cases(dense=not args.no_dense):
        row = time_case(spec, grads, device, cache, 0 if slow else args.repeats)
        print(json.dumps(row), flush=True)
        rows.append(row)
    env = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
           "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
           "machine": platform.machine(), "load_average": os.getloadavg(), "n_vectors": N_VECTORS,
           "n_coords": N_COORDS}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "projection_speed.json").write_text(json.dumps({"env": env, "cases": rows}, indent=2))


if __name__ == "__main__":
    main()
