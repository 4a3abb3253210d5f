"""The gradients job end to end on CUDA, against the same job on CPU: does a GPU worker rank a pool as the CPU does?

Takes a `make demo` folder's trained warm start (``models/theta0``) and its offline trajectories (the pool and
the two validation sets: real rewards), and runs the real doors, ``cropi gradients`` for each split and
``cropi rank``, into one store per side:

- ``cpu_float32``: the CPU default (float32, eager), the reference;
- ``cuda_float32``: the cuda engine, float32 (eager): the device alone, same precision;
- ``cuda_bfloat16``: the CUDA default (``--model-dtype auto``: bfloat16, sdpa): what a GPU worker stores.

Each side's ranking is compared with the reference's: per validation set, Spearman and Pearson over the pool's
scores, the largest score difference over the largest score, the share of the reference's top 10% that the
side's top 10% holds (precision@10%); for the fused ranking its top 10% and the Jaccard of the two selected
subsets (the default selector). Seconds of each
``cropi gradients`` call are recorded too (a small model: they say little about speed).

    python benchmarks/gpu/e2e.py --work DEMO_DIR --out DIR          ->  DIR/e2e.json     (needs CUDA)
    python benchmarks/gpu/e2e.py --work DEMO_DIR --out DIR --dry-run ->  DIR/e2e_dry_run.json (CPU: float32
        against bfloat16 on CPU; checks the script)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import environment, write_json  # noqa: E402

from cropi.cli import main as cropi  # noqa: E402

VALIDATION = ("val_max", "val_nth")
NAME = "theta0"


def split_dirs(work: Path) -> dict[str, Path]:
    """{split: trajectory store} from a demo folder's runs/trajectories/<hash>/<split>."""
    found = {p.name: p for p in (work / "runs" / "trajectories").glob("*/*") if p.is_dir()}
    missing = [s for s in ("pool", *VALIDATION) if s not in found]
    if missing:
        raise SystemExit(f"{work}: no trajectories for {missing} under runs/trajectories/*/ (a `make demo` folder)")
    return found


def run_side(work: Path, trajectories: dict[str, Path], store: Path, device: str, dtype: str) -> dict:
    seconds = {}
    for split in ("pool", *VALIDATION):
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cropi(["gradients", "--model", str(work / "models" / "theta0"), "--trajectories",
                        str(trajectories[split]), "--store", str(store), "--split", split, "--name", NAME,
                        "--device", device, "--model-dtype", dtype, "--attention", "auto", "--json"])
        if rc:
            raise RuntimeError(f"cropi gradients {split} on {device}/{dtype} exited {rc}")
        seconds[split] = time.perf_counter() - began
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = cropi(["rank", "--store", str(store), "--name", NAME, "--validation", ",".join(VALIDATION), "--json"])
    if rc:
        raise RuntimeError(f"cropi rank on {device}/{dtype} exited {rc}")
    answer = json.loads(printed.getvalue())
    rows = answer["rows"]
    return {"seconds": seconds, "meta": answer["meta"],
            "table": {key: [r.get(key) for r in rows]
                      for key in ("prompt_id", "rank", "selected", *(f"score:{v}" for v in VALIDATION))}}


def compare(ref: dict, side: dict) -> dict:
    """How far ``side``'s ranking is from ``ref``'s (module docstring): per validation set's scores, then the
    fused ranking and the selection."""
    a, b = ref["table"], side["table"]
    out = {}
    for col in [f"score:{v}" for v in VALIDATION]:
        sa, sb = dict(zip(a["prompt_id"], a[col])), dict(zip(b["prompt_id"], b[col]))
        ids = sorted(i for i in sa if sa[i] is not None and sb.get(i) is not None)
        x = np.array([sa[i] for i in ids], dtype=np.float64)
        y = np.array([sb[i] for i in ids], dtype=np.float64)
        k = max(1, round(0.1 * len(ids)))
        top = lambda v: {ids[j] for j in np.argsort(-v, kind="stable")[:k]}  # noqa: E731
        rank = lambda v: np.argsort(np.argsort(v, kind="stable"), kind="stable")  # noqa: E731
        out[col] = {"prompts_scored": len(ids), "only_one_side": len(set(sa) ^ set(sb)),
                    "spearman": float(np.corrcoef(rank(x), rank(y))[0, 1]),
                    "pearson": float(np.corrcoef(x, y)[0, 1]),
                    "max_difference_over_max_score": float(np.abs(x - y).max() / np.abs(x).max()),
                    "precision_at_10pct": len(top(x) & top(y)) / k}
    ranked = lambda t: [i for r, i in sorted((r, i) for i, r in zip(t["prompt_id"], t["rank"]) if r)]  # noqa: E731
    ra, rb = ranked(a), ranked(b)
    k = max(1, round(0.1 * len(ra)))
    sel_a = {i for i, s in zip(a["prompt_id"], a["selected"]) if s}
    sel_b = {i for i, s in zip(b["prompt_id"], b["selected"]) if s}
    out["fused"] = {"ranked": [len(ra), len(rb)], "precision_at_10pct": len(set(ra[:k]) & set(rb[:k])) / k,
                    "selected": [len(sel_a), len(sel_b)],
                    "selected_jaccard": len(sel_a & sel_b) / max(1, len(sel_a | sel_b))}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="a `make demo` folder (models/theta0, runs/trajectories)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU only: float32 against bfloat16 (checks the script)")
    a = ap.parse_args(argv)
    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu/e2e.py needs a CUDA device (--dry-run checks it on CPU)")
    sides = {"cpu_float32": ("cpu", "float32")}
    sides |= ({"cpu_bfloat16": ("cpu", "bfloat16")} if a.dry_run else
              {"cuda_float32": ("cuda", "float32"), "cuda_bfloat16": ("cuda", "auto")})
    trajectories = split_dirs(a.work)
    report = {"dry_run": a.dry_run, "card": None if a.dry_run else torch.cuda.get_device_name(0),
              "model": "the lists demo's warm start (models/theta0), trained; its offline trajectories",
              "sides": {}, "against_cpu_float32": {}, "environment": environment()}
    done = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (device, dtype) in sides.items():
            try:
                done[label] = run_side(a.work, trajectories, Path(tmp) / label, device, dtype)
                meta = done[label]["meta"]
                report["sides"][label] = {"device": device, "model_dtype": dtype, "seconds": done[label]["seconds"],
                                          "spec_id": meta.get("spec_id"), "selector": meta.get("selector")}
            except Exception as error:  # recorded; the other sides still run
                report["sides"][label] = {"error": f"{type(error).__name__}: {error}"[:2000]}
            print(f"[e2e] {label}: {report['sides'][label]}", flush=True)
    ref = done.get("cpu_float32")
    for label, side in done.items():
        if ref is not None and label != "cpu_float32":
            report["against_cpu_float32"][label] = compare(ref, side)
            print(f"[e2e] {label} against cpu_float32: {report['against_cpu_float32'][label]}", flush=True)
    write_json(a.out, "e2e_dry_run.json" if a.dry_run else "e2e.json", report)
    return report


if __name__ == "__main__":
    main()
