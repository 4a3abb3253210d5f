"""Shared set-up for benchmarks: a small local model and synthetic offline trajectories.

Trajectories are sampled from the model itself (so log-probs are real behavior
log-probs) on the synthetic arithmetic prompts; rewards are drawn per prompt from
a Bernoulli with a prompt-specific pass rate. The benchmarks measure projection
fidelity and speed, which depend on the gradients' structure, not on whether the
model can do arithmetic (a random-init model cannot).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from cropi.generation import SamplingConfig, make_backend
from cropi.generation.prompting import render_prompt
from cropi.models import build_tiny_model
from cropi.models.loading import load_causal_lm, load_tokenizer
from cropi.store import PromptTrajectories
from cropi.tasks.arithmetic import make_task_splits


def small_model(workdir: Path, size: str = "small") -> str:
    path = workdir / f"model-{size}"
    if not (path / "config.json").exists():
        build_tiny_model(path, size=size, seed=0)
    return str(path)


def synthetic_trajectories(model_path: str, n_prompts: int, *, samples: int = 8, max_new_tokens: int = 32,
                           seed: int = 0) -> list[PromptTrajectories]:
    records = make_task_splits(seed, pool_size=max(n_prompts, 200), val_size=20, test_size=20)["pool"][:n_prompts]
    tok = load_tokenizer(model_path)
    prompts = [render_prompt(tok, r.prompt) for r in records]
    cfg = SamplingConfig(samples=samples, temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed)
    with make_backend("hf", model_path) as backend:
        outs = backend.generate(prompts, [r.prompt_id for r in records], cfg)
    rng = np.random.default_rng(seed)
    trajs = []
    for r, p, samples_ in zip(records, prompts, outs):
        rate = rng.beta(0.7, 0.7)
        rewards = (rng.random(len(samples_)) < rate).astype(float).tolist()
        trajs.append(PromptTrajectories(prompt_id=r.prompt_id, prompt_token_ids=p,
                                        responses=[s.token_ids for s in samples_],
                                        behavior_logprobs=[s.logprobs for s in samples_], rewards=rewards,
                                        finish_reasons=[s.finish_reason for s in samples_],
                                        texts=[s.text for s in samples_]))
    return trajs


def load_model(model_path: str):
    return load_causal_lm(model_path, device="cpu")


def environment() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.machine(), "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_json(out: Path, name: str, payload: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(payload, indent=2))
    return path
