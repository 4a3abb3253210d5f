"""Responses per second of the hf and vllm generation backends, side by side.

    python benchmarks/collect_throughput.py --out out/bench            # tiny model built in out/bench/model
    python benchmarks/collect_throughput.py --out out/bench --model PATH --prompts 64 --samples 8

Each backend is started once (start time recorded) and warmed up on two prompts;
then the backends take turns generating the full batch, ``--repeats`` rounds. Writes DIR/collect_throughput.json
with per-run figures, the medians, and how far each backend's behavior log-probs
are from transformers teacher forcing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for collect_throughput.json (and the built model)")
    p.add_argument("--model", help="checkpoint folder; default: build a tiny model into OUT/model")
    p.add_argument("--size", default="tiny", choices=["tiny", "small"], help="tiny model to build")
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hf-batch-rows", type=int, default=256, help="hf backend: responses decoded together")
    p.add_argument("--check-prompts", type=int, default=4, help="prompts whose log-probs are teacher-forced")
    return p.parse_args(argv)


def questions(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"Ann has {rng.randint(2, 99)} apples and buys {rng.randint(1, 50)} more. How many apples does she "
            f"have now? Put the answer in \\boxed{{}}." for _ in range(n)]


def start_backend(name: str, model: Path, ids, cfg, args) -> tuple[object, dict]:
    """Start a backend and warm it up; returns it with its start and warm-up seconds."""
    from cropi.generation import make_backend

    opts = {"max_batch_rows": args.hf_batch_rows} if name == "hf" else {}
    t0 = time.perf_counter()
    backend = make_backend(name, model, **opts)
    started = time.perf_counter() - t0
    t0 = time.perf_counter()
    backend.generate(ids[:2], ["warmup-a", "warmup-b"], cfg)
    return backend, {"start_s": started, "warmup_s": time.perf_counter() - t0, "runs": []}


def summarize(figures: dict) -> dict:
    runs = figures["runs"]
    return figures | {"median_seconds": statistics.median(r["seconds"] for r in runs),
                      "median_responses_per_s": statistics.median(r["responses_per_s"] for r in runs),
                      "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                      "median_responses_per_cpu_s": statistics.median(r["responses_per_cpu_s"] for r in runs)}


def _run_figures(outputs, seconds: float, cpu_seconds: float) -> dict:
    """Wall-clock rates, and rates per CPU-second of this process (robust to other load)."""
    samples = [s for group in outputs for s in group]
    n_tokens = sum(len(s.token_ids) for s in samples)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "responses": len(samples), "tokens": n_tokens,
            "responses_per_s": len(samples) / seconds, "tokens_per_s": n_tokens / seconds,
            "responses_per_cpu_s": len(samples) / cpu_seconds,
            "mean_response_tokens": n_tokens / len(samples),
            "stopped_fraction": sum(s.finish_reason == "stop" for s in samples) / len(samples)}


def logprob_error(model: Path, ids, outputs) -> float:
    """Max |backend log-prob - transformers teacher-forced log-prob| over the given prompts."""
    import torch

    from cropi.models import load_causal_lm

    lm = load_causal_lm(model)
    worst = 0.0
    for prompt, group in zip(ids, outputs):
        for s in group:
            seq = torch.tensor([prompt + s.token_ids])
            with torch.no_grad():
                logits = lm(seq).logits[0, len(prompt) - 1:-1].double()
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(s.token_ids)[:, None])[:, 0]
            worst = max(worst, (ref - torch.tensor(s.logprobs, dtype=torch.float64)).abs().max().item())
    return worst


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from cropi.generation import SamplingConfig, render_prompt
    from cropi.models import build_tiny_model, load_tokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else build_tiny_model(out / "model", size=args.size)
    tok = load_tokenizer(model)
    ids = [render_prompt(tok, q) for q in questions(args.prompts)]
    keys = [f"bench-{i}" for i in range(len(ids))]
    cfg = SamplingConfig(samples=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    # the model's folder name, not this machine's path; a built model is named by its size
    report = {"model": Path(args.model).name if args.model else f"tiny model ({args.size}) built by the benchmark",
              "sampling": cfg.model_dump(), "prompts": len(ids),
              "mean_prompt_tokens": sum(map(len, ids)) / len(ids),
              "machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "platform": platform.platform(), "torch": torch.__version__,
                          "load_average_before": os.getloadavg()}, "backends": {}}
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    # Both engines stay up and the timed runs alternate, so load from other processes on a
    # shared machine hits each backend alike. hf starts first: an in-process vLLM CPU engine
    # fixes torch's thread settings for the rest of the process.
    backends, figures, outputs = {}, {}, {}
    try:
        for name in names:
            backends[name], figures[name] = start_backend(name, model, ids, cfg, args)
        for _ in range(args.repeats):
            for name in names:
                t0, c0 = time.perf_counter(), time.process_time()
                outputs[name] = backends[name].generate(ids, keys, cfg)
                figures[name]["runs"].append(_run_figures(outputs[name], time.perf_counter() - t0,
                                                          time.process_time() - c0))
    finally:
        for backend in backends.values():
            backend.close()
    for name in names:
        summary = summarize(figures[name])
        n = args.check_prompts
        summary["max_abs_logprob_error_vs_teacher_forcing"] = logprob_error(model, ids[:n], outputs[name][:n])
        report["backends"][name] = summary
        print(f"{name}: start {summary['start_s']:.1f} s, {summary['median_responses_per_s']:.1f} responses/s, "
              f"{summary['median_tokens_per_s']:.0f} tokens/s, "
              f"{summary['median_responses_per_cpu_s']:.1f} responses/CPU-s, log-prob error "
              f"{summary['max_abs_logprob_error_vs_teacher_forcing']:.2g}", flush=True)
    report["machine"]["load_average_after"] = os.getloadavg()
    b = report["backends"]
    if "hf" in b and "vllm" in b:
        for key in ("median_responses_per_s", "median_responses_per_cpu_s"):
            report[f"vllm_over_hf_{key}"] = b["vllm"][key] / b["hf"][key]
    (out / "collect_throughput.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":  # vLLM's engine may spawn processes: keep the guard
    main()
