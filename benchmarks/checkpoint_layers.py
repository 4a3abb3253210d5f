"""What ``ModelOptions.checkpoint_layers`` saves and costs on the batched scoring path, measured on CPU.

The GPU check (benchmarks/gpu/check.py, ``memory_16k``) measures it on a card; this measures it here, where
``make test`` runs, on a model large enough for the activations to dominate: a random-initialised Qwen2 of
``SHAPE`` (8 layers, width 512, MLP 2048, vocabulary 8192; float32, sdpa) scoring ``--prompts`` prompts of 8
responses x ``--response-tokens`` tokens in one micro-batch (the default spec, the cpu engine).

Each side (``plain``, ``checkpointed``) runs in a process of its own, the two alternating with their order
rotating round by round. A side reports the seconds of the scoring call and its peak resident memory above
what the process held before it (``VmHWM`` after resetting it through ``/proc/self/clear_refs``; torch's CPU
allocator returns freed blocks to ``malloc``, so the peak is the pass's own). The two sides' vectors must agree
within float32 rounding, else the figure is no figure.

    python benchmarks/checkpoint_layers.py [--rounds 2] --out benchmarks/results   ->  OUT/checkpoint_layers.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402

SHAPE = dict(vocab_size=8192, hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)
# float32 sums of a backward in two summation orders: ~1e-6 of the largest entry; a dropped or doubled layer's
# share moves a vector by far more
AGREE = 1e-4


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(checkpoint: bool, prompts: int, response_tokens: int, prompt_tokens: int) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    from check import build_model, trajectories

    from cropi.gradients import LossOptions, make_computer
    from cropi.projection import make_projector
    from cropi.projection.spec import default_spec

    model = build_model(SHAPE, torch.device("cpu"), torch.float32, "sdpa")
    trajs = trajectories(prompts, SHAPE["vocab_size"], 8, response_tokens, prompt_tokens)
    budget = prompts * 8 * (prompt_tokens + response_tokens)  # one micro-batch: the peak is one pass's
    projector = make_projector(default_spec("cpu"), {n: tuple(p.shape) for n, p in model.named_parameters()})
    computer = make_computer(model, projector, LossOptions(token_budget=budget))
    computer.pack = False  # every response its own row, as on a GPU's micro-batch
    computer.checkpoint_layers = checkpoint
    computer.compute_many(trajs[:1])  # plans and hashes built outside the measured peak
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    before = _kib("VmRSS")
    began = time.perf_counter()
    records = computer.compute_many(trajs)
    seconds = time.perf_counter() - began
    peak = _kib("VmHWM")
    vectors = np.stack([r.vector for r in records])
    return {"seconds": seconds, "peak_above_start_mib": (peak - before) / 1024, "rss_before_mib": before / 1024,
            "tokens": budget, "vectors": vectors.tolist()}


def run(checkpoint: bool, a) -> dict:
    cmd = [sys.executable, __file__, "--child", "--checkpoint" if checkpoint else "--no-checkpoint",
           "--prompts", str(a.prompts), "--response-tokens", str(a.response_tokens),
           "--prompt-tokens", str(a.prompt_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--response-tokens", type=int, default=96)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.checkpoint, a.prompts, a.response_tokens, a.prompt_tokens)))
        return {}
    sides = {"plain": False, "checkpointed": True}
    got: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(a.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            got[name].append(run(sides[name], a))
            print(f"[checkpoint_layers] round {r} {name}: {got[name][-1]['seconds']:.2f} s, "
                  f"peak +{got[name][-1]['peak_above_start_mib']:.0f} MiB", flush=True)
    plain, ckpt = (np.array(got[n][0]["vectors"]) for n in sides)
    scale = float(np.abs(plain).max())
    difference = float(np.abs(ckpt - plain).max()) / scale
    if not difference <= AGREE:
        raise SystemExit(f"the checkpointed vectors differ from the plain ones by {difference:.2e} of the largest "
                         f"entry (bound {AGREE}): no figure")
    summary = {name: {"seconds": [g["seconds"] for g in got[name]],
                      "peak_above_start_mib": [g["peak_above_start_mib"] for g in got[name]]} for name in sides}
    best = {name: min(summary[name]["seconds"]) for name in sides}
    peak = {name: float(np.median(summary[name]["peak_above_start_mib"])) for name in sides}
    result = {
        "command": "python benchmarks/checkpoint_layers.py --out benchmarks/results",
        "what": "the default spec's batched scoring of one micro-batch on CPU (float32, sdpa, cpu engine), with and "
                "without ModelOptions.checkpoint_layers, each side in its own process, alternating",
        "shape": SHAPE, "prompts": a.prompts, "responses": 8, "response_tokens": a.response_tokens,
        "prompt_tokens": a.prompt_tokens, "tokens": got["plain"][0]["tokens"], "rounds": a.rounds,
        "sides": summary,
        "peak_above_start_mib": peak,
        "peak_ratio_checkpointed_over_plain": peak["checkpointed"] / peak["plain"],
        "seconds_ratio_checkpointed_over_plain": best["checkpointed"] / best["plain"],
        "max_vector_difference_over_largest": difference,
        "environment": environment(),
    }
    write_json(a.out, "checkpoint_layers.json", result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("sides", "environment", "shape")}, indent=1))
    return result


if __name__ == "__main__":
    main()
