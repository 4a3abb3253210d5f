"""How to add a formed gradient's (out x in) pairs into their ``dim`` TensorSketch buckets on CUDA: the cuda
engine's direct route (cropi.projection.tensorsketch) spends ~35% of its device time in float32
``index_add_`` (benchmarks/results/gpu/check_before_spread.json, ``profile_default``). This times the
candidates side by side on one card (``engine_rule``: the copies the engine took before its folded layout,
``ADDS_PER_COPY``; ``previous_pass`` and ``folded_pass``: a layer's whole per-pass work after the product, before
and now: the addresses formed, the signs applied, the adds, the copies summed),
for Qwen2.5-1.5B's layer shapes, against forming the gradient itself (the bfloat16 product over a prompt's
5,120 tokens with float32 results), and checks each against float64 sums.

    python benchmarks/gpu/scatter.py --out DIR        (--dry-run: small shapes on CPU, checks only)  -> DIR/scatter.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import environment, write_json  # noqa: E402

from cropi.projection import tensorsketch as ts  # noqa: E402

SHAPES = [(8960, 1536), (1536, 8960), (1536, 1536), (256, 1536)]  # gate/up, down, q/o, k/v
DIMS = [4096, 32768]


def candidates(bucket: torch.Tensor, dim: int, in_f: int, h_out: torch.Tensor, h_in: torch.Tensor):
    """name -> (prepare once per layer, add one gradient's flat values)."""
    b64 = bucket.long()
    n = bucket.numel()
    out_f = n // in_f
    ones = torch.ones(out_f, 1, device=bucket.device)  # the signs the previous pass multiplied in (all +1 here)

    def previous_pass(v):  # the engine before fold_sides: three passes for the addresses, one for the signs
        r = ts.scatter_copies(n, dim)
        spread = (torch.arange(in_f, dtype=torch.int32, device=v.device) % r) * dim
        idx = (h_out[:, None] + h_in[None, :]).remainder_(dim).add_(spread).reshape(-1)
        g = v.view(out_f, in_f).mul(ones)
        return torch.zeros(r * dim, dtype=v.dtype, device=v.device).index_add_(0, idx, g.reshape(-1)).view(r, dim).sum(0)

    r_fold = ts.scatter_copies(n, ts.FOLDED * dim)
    a_side = h_out  # every sign +1: quadrant 0 (the engine's quadrant offsets are part of its cached sides)
    b_side = h_in + (torch.arange(in_f, dtype=torch.int32, device=bucket.device) % r_fold) * 2 * dim

    def folded_pass(v):  # the engine now (tensorsketch.fold_sides): one add for the addresses, the fold after
        idx = (a_side[:, None] + b_side[None, :]).reshape(-1)
        acc = torch.zeros(r_fold * ts.FOLDED * dim, dtype=v.dtype, device=v.device).index_add_(0, idx, v)
        q = acc.view(4, r_fold * 2, dim).sum(1)
        return (q[0] - q[1]) - (q[2] - q[3])

    def replicated(r, width=n):  # pair p into copy (p % width) % r; the engine's width: the input coordinates
        idx = (bucket + (torch.arange(n, device=bucket.device, dtype=torch.int32) % width % r) * dim)

        def run(v):
            return torch.zeros(r * dim, dtype=v.dtype, device=v.device).index_add_(0, idx, v).view(r, dim).sum(0)
        return run

    order = torch.argsort(b64)
    counts = torch.bincount(b64, minlength=dim)
    ends = torch.cumsum(counts, 0) - 1
    order32 = order.int()

    def sorted_sum(v):  # gather in bucket order; float64 running sum read at each bucket's end, differenced
        c = torch.cumsum(v[order32].double(), 0)
        through = torch.where(ends >= 0, c[ends.clamp(min=0)], torch.zeros((), dtype=c.dtype, device=c.device))
        return torch.diff(through, prepend=through.new_zeros(1)).float()

    def segment(v):
        return torch.segment_reduce(v[order32], "sum", lengths=counts)

    return {
        "engine_rule": replicated(ts.scatter_copies(n, dim), in_f),  # the engine's copies before the folded layout
        "previous_pass": previous_pass,
        "folded_pass": folded_pass,
        "index_add_int32": lambda v: torch.zeros(dim, dtype=v.dtype, device=v.device).index_add_(0, bucket, v),
        "index_add_int64": lambda v: torch.zeros(dim, dtype=v.dtype, device=v.device).index_add_(0, b64, v),
        "scatter_add": lambda v: torch.zeros(dim, dtype=v.dtype, device=v.device).scatter_add_(0, b64, v),
        "bincount": lambda v: torch.bincount(b64, weights=v, minlength=dim).to(v.dtype),
        "replicated_16": replicated(16),
        "replicated_128": replicated(128),
        "replicated_1024": replicated(1024),
        "sorted_cumsum": sorted_sum,
        "segment_reduce": segment,
    }


def clock(fn, device, repeat: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--tokens", type=int, default=5120)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    device = torch.device("cpu" if a.dry_run else "cuda")
    shapes = [(64, 48), (48, 96)] if a.dry_run else SHAPES
    dims = [256] if a.dry_run else DIMS
    tokens = 40 if a.dry_run else a.tokens
    report = {"dry_run": a.dry_run, "tokens": tokens, "cells": [], "environment": environment()}
    gen = torch.Generator(device=device).manual_seed(0)
    for out_f, in_f in shapes:
        d = torch.randn(tokens, out_f, device=device, generator=gen).to(torch.bfloat16)
        x = torch.randn(tokens, in_f, device=device, generator=gen).to(torch.bfloat16)
        if device.type == "cuda":
            def form():
                return torch.mm(d.T, x, out_dtype=torch.float32)
        else:
            def form():
                return d.T.float() @ x.float()
        g = form().reshape(-1)
        form_s = clock(form, device, a.repeat)
        for dim in dims:
            h_out = torch.randint(0, dim, (out_f,), device=device, generator=gen, dtype=torch.int32)
            h_in = torch.randint(0, dim, (in_f,), device=device, generator=gen, dtype=torch.int32)
            bucket = (h_out[:, None] + h_in[None, :]).remainder_(dim).reshape(-1)
            exact = torch.zeros(dim, dtype=torch.float64, device=device).index_add_(0, bucket.long(), g.double())
            cell = {"out": out_f, "in": in_f, "dim": dim, "form_gradient_s": form_s, "seconds": {}, "max_error": {}}
            for name, fn in candidates(bucket, dim, in_f, h_out, h_in).items():
                try:
                    got = fn(g)
                    cell["max_error"][name] = float((got.double() - exact).abs().max() / exact.abs().max())
                    cell["seconds"][name] = clock(lambda: fn(g), device, a.repeat)
                except Exception as error:  # recorded: a candidate this build lacks
                    cell["seconds"][name] = f"{type(error).__name__}: {str(error)[:200]}"
            report["cells"].append(cell)
            print(f"[scatter] {out_f}x{in_f} dim {dim}: form {form_s * 1e3:.2f} ms; "
                  + ", ".join(f"{k} {v * 1e3:.2f}" if isinstance(v, float) else f"{k} failed"
                              for k, v in cell["seconds"].items()), flush=True)
            write_json(a.out, "scatter_dry_run.json" if a.dry_run else "scatter.json", report)
    return report


if __name__ == "__main__":
    main()
