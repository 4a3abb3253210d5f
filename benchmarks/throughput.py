"""Seconds per prompt: POPI gradient + projection versus a plain forward+backward pass.

Both sides run over exactly the same tokens in the same micro-batches, interleaved
prompt by prompt in one run (so machine noise hits both alike). The plain pass is the
floor any per-prompt gradient method pays; ``ratio_to_fwd_bwd`` is what cropi adds.

    python benchmarks/throughput.py [--quick] --out DIR   ->  DIR/throughput.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, load_model, small_model, synthetic_trajectories, write_json  # noqa: E402

from cropi.gradients import GradientComputer, LossOptions  # noqa: E402
from cropi.gradients.batching import build_micro_batch, plan_micro_batches  # noqa: E402
from cropi.projection import ProjectionSpec, make_projector  # noqa: E402


def plain_fwd_bwd(model, traj, budget: int, pad_id: int) -> None:
    """Forward and backward over the prompt's micro-batches with a trivial loss."""
    lengths = [len(traj.prompt_token_ids) + len(r) for r in traj.responses]
    for idx in plan_micro_batches(lengths, budget):
        mb = build_micro_batch(list(traj.prompt_token_ids), traj.responses, traj.behavior_logprobs, idx, pad_id)
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                    logits_to_keep=mb.targets.shape[1] + 1, use_cache=False)
        logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, mb.targets[..., None]).squeeze(-1)
        (-(logp * mb.response_mask).sum()).backward()
    model.zero_grad(set_to_none=True)


def run(quick: bool, out: Path, workdir: Path, spec: ProjectionSpec) -> dict:
    model_path = small_model(workdir)
    model = load_model(model_path)
    n = 16 if quick else 48
    trajs = [t for t in synthetic_trajectories(model_path, n, max_new_tokens=64, seed=2) if len(set(t.rewards)) > 1]
    shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
    t0 = time.perf_counter()
    projector = make_projector(spec, shapes)
    computer = GradientComputer(model, projector, LossOptions())
    computer.compute(trajs[0])  # warm-up: builds and caches the projection plan
    plan_seconds = time.perf_counter() - t0
    plain_fwd_bwd(model, trajs[0], computer.options.token_budget, computer.pad_id)
    ours, plain = [], []
    for i, t in enumerate(trajs):
        sides = [("ours", lambda: computer.compute(t)),
                 ("plain", lambda: plain_fwd_bwd(model, t, computer.options.token_budget, computer.pad_id))]
        for name, fn in (sides if i % 2 == 0 else sides[::-1]):
            s = time.perf_counter()
            fn()
            (ours if name == "ours" else plain).append(time.perf_counter() - s)
    tokens = [sum(len(t.prompt_token_ids) + len(r) for r in t.responses) for t in trajs]
    report = {"quick": quick, "spec": spec.model_dump(), "spec_id": spec.spec_id, "prompts": len(trajs),
              "responses_per_prompt": 8, "mean_tokens_per_prompt": float(np.mean(tokens)),
              "model_parameters": sum(p.numel() for p in model.parameters()), "n_kept": projector.n_kept,
              "seconds_per_prompt": {"gradient_plus_projection": float(np.mean(ours)),
                                     "plain_forward_backward": float(np.mean(plain))},
              "median_seconds_per_prompt": {"gradient_plus_projection": float(np.median(ours)),
                                            "plain_forward_backward": float(np.median(plain))},
              "ratio_to_fwd_bwd": float(np.sum(ours) / np.sum(plain)),
              "projection_plan_seconds_once": plan_seconds, "environment": environment()}
    write_json(out, "throughput.json", report)
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--kept-fraction", type=float, default=None)
    ap.add_argument("--dim", type=int, default=None)
    a = ap.parse_args(argv)
    fields = {k: v for k, v in {"kept_fraction": a.kept_fraction, "dim": a.dim}.items() if v is not None}
    r = run(a.quick, a.out, a.workdir or a.out / "work", ProjectionSpec(**fields))
    print(f"ratio_to_fwd_bwd {r['ratio_to_fwd_bwd']:.3f} "
          f"({r['seconds_per_prompt']['gradient_plus_projection']:.4f} s vs "
          f"{r['seconds_per_prompt']['plain_forward_backward']:.4f} s a prompt); wrote {a.out / 'throughput.json'}")


if __name__ == "__main__":
    main()
