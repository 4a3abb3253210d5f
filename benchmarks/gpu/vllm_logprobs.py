"""A vLLM collection on GPU whose behavior log-probs are the gradient's forward pass.

vLLM samples in bfloat16 here; cropi teacher-forces the behavior model in float32
after generation (cropi.generation.vllm), so the stored log-probs must agree with
what ``GradientComputer`` computes at the behavior checkpoint (ratio 1). Records the
engine-vs-stored drift per shard and the largest stored-vs-gradient difference.

    python benchmarks/gpu/vllm_logprobs.py --out benchmarks/results/gpu  ->  vllm_logprobs.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import environment, small_model, write_json  # noqa: E402

from cropi.data import write_verl_parquet  # noqa: E402
from cropi.generation import SamplingConfig, make_backend  # noqa: E402
from cropi.gradients import GradientComputer  # noqa: E402
from cropi.gradients.batching import build_micro_batch, plan_micro_batches  # noqa: E402
from cropi.models.loading import load_causal_lm  # noqa: E402
from cropi.pipeline.collect import CollectJob, collect  # noqa: E402
from cropi.projection import ProjectionSpec, make_projector  # noqa: E402
from cropi.store import TrajectoryStore  # noqa: E402
from cropi.tasks.arithmetic import make_task_splits  # noqa: E402

TOLERANCE = 1e-5


def run(out: Path, workdir: Path, n_prompts: int) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu/vllm_logprobs.py needs a CUDA device")
    model = small_model(workdir)
    prompts = workdir / "prompts.parquet"
    write_verl_parquet(make_task_splits(0, pool_size=n_prompts, val_size=1, test_size=1)["pool"], str(prompts))
    store = workdir / "traj"
    shutil.rmtree(store, ignore_errors=True)
    job = CollectJob(model=model, prompts=str(prompts), out=str(store), backend="vllm", reward="exact_numeric",
                     sampling=SamplingConfig(samples=8, temperature=1.0, max_new_tokens=256, seed=0))
    t0 = time.perf_counter()
    backend = make_backend("vllm", model, dtype="bfloat16", gpu_memory_utilization=0.5)
    try:
        engine = {"engine_dtype": backend.engine_dtype, "teacher_force": backend.teacher_force,
                  "logprob_dtype": backend.logprob_dtype}
        collect(job, backend=backend)
    finally:
        backend.close()
    seconds = time.perf_counter() - t0
    drift = [json.loads(p.read_text()) for p in sorted((store / "logprob_drift").glob("*.json"))]
    worst = stored_vs_gradient(model, TrajectoryStore.open(str(store)))
    report = {**engine, "prompts": n_prompts, "collect_seconds": seconds,
              "engine_vs_teacher_forced_max_abs_diff_per_shard": [d["max_abs_diff"] for d in drift],
              "stored_vs_gradient_forward_max_abs_diff": worst, "tolerance": TOLERANCE,
              "agrees": worst <= TOLERANCE, "environment": environment()}
    write_json(out, "vllm_logprobs.json", report)
    return report


@torch.no_grad()
def stored_vs_gradient(model_path: str, store: TrajectoryStore) -> float:
    """max |stored behavior log-prob - GradientComputer's log-prob| over every response token."""
    model = load_causal_lm(model_path, device="cuda")
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    computer = GradientComputer(model, make_projector(ProjectionSpec(kind="sjlt", dim=8), shapes, device="cuda"))
    worst = 0.0
    for traj in store.iter_prompts():
        prompt, responses = list(traj.prompt_token_ids), [list(r) for r in traj.responses]
        lengths = [len(prompt) + len(r) for r in responses]
        for idx in plan_micro_batches(lengths, computer.options.token_budget):
            mb = build_micro_batch(prompt, responses, [list(b) for b in traj.behavior_logprobs], idx, computer.pad_id)
            logp = computer._token_logprobs(mb)
            mask = mb.response_mask.bool().to(logp.device)
            if mask.any():
                diff = (logp[mask] - mb.behavior_logp.to(logp.device)[mask]).abs().max()
                worst = max(worst, float(diff))
    return worst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu"))
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--prompts", type=int, default=64)
    a = ap.parse_args(argv)
    r = run(a.out, a.workdir or a.out / "work", a.prompts)
    print(f"engine {r['engine_dtype']}, stored log-probs vs the gradient's forward: max abs diff "
          f"{r['stored_vs_gradient_forward_max_abs_diff']:.2e} (agrees: {r['agrees']}); wrote {a.out}")


if __name__ == "__main__":
    main()
