"""A CROPI stage's scoring cost on the `lists` demo: the demo's per-prompt sjlt against the batched
kinds, side by side, and the stage estimate they give.

The demo's own situation: the `lists` task's shipped warm-started model, its pool and targeted
validation prompts, trajectories sampled by the hf backend at the demo's settings (K = 8 pool, 16
validation responses, T = 0.5, the task's 5 new tokens) and scored by the task's reward. The same
trajectories go through each side, chunk by chunk, the order rotating (machine noise hits all alike),
one torch thread:

- ``sjlt``: the demo's spec (``ProjectionSpec(kind="sjlt", dim=2048, kept_fraction=0.1)``; cropi/demo/runner.py),
  ``GradientComputer`` one prompt at a time, as the curriculum scores today;
- ``tensorsketch``: ``--sketch-dim`` (4096), the batched computer (``make_computer``), as
  ``compute_gradients`` runs it: ``prompts_per_call`` prompts a call, each prompt's responses packed
  into one row where ``cropi.gradients.packing.should_pack`` says so (here: every prompt);
- ``tensorsketch_rows``: the same computer with packing off, every response its own row (what
  packing saves);
- ``factored``: 16 x 16 (the earlier batched kind), for reference;
- ``plain``: forward and backward of the POPI micro-batches with every weight gradient formed, no
  projection: the floor of any per-prompt method.

Informative prompts (mixed rewards) get a forward and a backward; zero-advantage prompts a forward
only (their ESS), timed apart (``plain`` runs the forward of ``sjlt``'s rows for them).
``stage_estimate_s`` = seconds a prompt x (pool + validation prompts of the demo's stage: 1,200 and
2 x 100) in the measured informative shares, the gradient part of a stage's ``score_s``; ranking is
the same for every side.

    python benchmarks/batched_scoring.py [--pool 256] [--val 48] --out benchmarks/results
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import collect_trajectories, environment, interleaved, load_model, plain_fwd_bwd, write_json  # noqa: E402

from cropi.demo.assets import shipped_model, task_splits  # noqa: E402
from cropi.gradients import LossOptions, make_computer  # noqa: E402
from cropi.projection import ProjectionSpec, make_projector  # noqa: E402

TASK = "lists"
STAGE = {"pool": 1200, "validation": 200}  # the demo's stage: pool_size 1200, val_size 100 x 2 targets
CHUNK = 16


def side(model_path: str, spec: ProjectionSpec):
    model = load_model(model_path)
    projector = make_projector(spec, {k: tuple(p.shape) for k, p in model.named_parameters()})
    return make_computer(model, projector, LossOptions()), projector


def run(pool_n: int, val_n: int, sketch_dim: int, out: Path) -> dict:
    torch.set_num_threads(1)
    model_path = str(shipped_model(TASK))
    splits = task_splits(TASK)
    t0 = time.perf_counter()
    pool = collect_trajectories(model_path, splits["pool"][:pool_n], samples=8, temperature=0.5, max_new_tokens=5,
                                seed=1)
    val = collect_trajectories(model_path, splits["val_max"][:val_n] + splits["val_nth"][:val_n], samples=16,
                               temperature=0.5, max_new_tokens=5, seed=2)
    collect_s = time.perf_counter() - t0
    specs = {"sjlt": ProjectionSpec(kind="sjlt", dim=2048, kept_fraction=0.1),
             "tensorsketch": ProjectionSpec(kind="tensorsketch", dim=sketch_dim),
             "factored": ProjectionSpec(kind="factored", factor_in=16, factor_out=16)}
    sides = {name: side(model_path, spec) for name, spec in specs.items()}
    sides["tensorsketch_rows"] = side(model_path, specs["tensorsketch"])
    sides["tensorsketch_rows"][0].pack = False
    plain_model = load_model(model_path)
    budget, pad_id = LossOptions().token_budget, sides["sjlt"][0].pad_id
    informative = {"pool": [t for t in pool if len(set(t.rewards)) > 1],
                   "validation": [t for t in val if len(set(t.rewards)) > 1]}
    flat = {"pool": [t for t in pool if len(set(t.rewards)) <= 1],
            "validation": [t for t in val if len(set(t.rewards)) <= 1]}
    for comp, _ in sides.values():
        comp.compute_many(informative["pool"][:2])  # warm-up: plans, hashes
    fns = {"plain": lambda chunk: [plain_fwd_bwd(plain_model, t, budget, pad_id) for t in chunk],
           "sjlt": lambda chunk: [sides["sjlt"][0].compute(t) for t in chunk],
           "tensorsketch": lambda chunk: sides["tensorsketch"][0].compute_many(chunk),
           "factored": lambda chunk: sides["factored"][0].compute_many(chunk),
           "tensorsketch_rows": lambda chunk: sides["tensorsketch_rows"][0].compute_many(chunk)}
    forward = dict(fns, plain=fns["sjlt"])  # a zero-advantage prompt: a forward on every side
    per_prompt = {split: timed(fns, trajs) for split, trajs in informative.items()}
    per_flat = {split: timed(forward, trajs) for split, trajs in flat.items()}
    share = {split: len(informative[split]) / len(trajs) for split, trajs in (("pool", pool), ("validation", val))}
    estimate = {name: sum(STAGE[split] * (share[split] * per_prompt[split][name]
                                          + (1 - share[split]) * per_flat[split][name]) for split in STAGE)
                for name in fns}
    # ratios of the stage estimates (pool and validation prompts in the stage's proportions)
    ratios = {f"{name}_over_plain": estimate[name] / estimate["plain"] for name in fns if name != "plain"}
    ratios["sjlt_over_tensorsketch"] = estimate["sjlt"] / estimate["tensorsketch"]
    ratios["tensorsketch_rows_over_tensorsketch"] = estimate["tensorsketch_rows"] / estimate["tensorsketch"]
    report = {"task": TASK, "model": model_path.split("/")[-1],
              "model_parameters": sum(p.numel() for p in plain_model.parameters()),
              "prompts": {"pool": len(pool), "validation": len(val)},
              "informative_prompts": {k: len(v) for k, v in informative.items()},
              "informative_share": share, "samples": {"pool": 8, "validation": 16}, "max_new_tokens": 5,
              "specs": {name: {"spec": p.spec.model_dump(), "spec_id": p.spec.spec_id, "out_dim": p.out_dim}
                        for name, (_, p) in sides.items()},
              "seconds_per_informative_prompt": per_prompt, "seconds_per_zero_advantage_prompt": per_flat,
              "stage": STAGE, "stage_estimate_s": estimate, "ratios": ratios,
              "goal": {"tensorsketch_over_plain_at_most": 0.5,
                       "met": ratios["tensorsketch_over_plain"] <= 0.5},
              "collect_s": collect_s, "environment": environment()}
    write_json(out, "batched_scoring.json", report)
    return report


def timed(fns: dict, trajs: list) -> dict[str, float]:
    """Seconds a prompt of each side over ``trajs`` (``common.interleaved``: chunk by chunk, order rotating)."""
    return {name: sum(chunks) / max(1, len(trajs)) for name, chunks in interleaved(fns, trajs, CHUNK).items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=256)
    ap.add_argument("--val", type=int, default=48, help="prompts per targeted validation set")
    ap.add_argument("--sketch-dim", type=int, default=4096)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    r = run(a.pool, a.val, a.sketch_dim, a.out)
    print(f"stage estimate (s): {r['stage_estimate_s']}; ratios {r['ratios']}; wrote {a.out / 'batched_scoring.json'}")


if __name__ == "__main__":
    main()
