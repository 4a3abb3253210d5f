"""Shared set-up for benchmarks.

Speed benchmarks use a small local model and synthetic offline trajectories
(sampled from the model itself, so log-probs are real behavior log-probs; rewards
drawn per prompt from a Bernoulli), since speed depends on the gradients' shapes.

Fidelity benchmarks need influence that means something: a model warm-started on
the demo's skills task (``warm_model``) and responses it really sampled, scored by
the task's verifiable reward (``collect_trajectories``).
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
from cropi.models import tiny as tiny_models
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


def warm_model(workdir: Path, name: str, dims: dict, config) -> str:
    """A model of shape ``dims`` warm-started on the demo's supervised set (cropi.models.warmstart),
    built once into ``workdir/name`` and reused. ``config``: a WarmStartConfig whose size is ``name``."""
    from cropi.demo.assets import warmstart_records
    from cropi.models.warmstart import warm_start

    path = workdir / name
    if not (path / "model.safetensors").exists():
        # build_tiny_model knows its sizes by name: the benchmark's larger one is registered here
        tiny_models.SIZES.setdefault(name, dict(dims))
        t0 = time.perf_counter()
        warm_start(path, warmstart_records(), config, log=print)
        (path / "warmstart-benchmark.json").write_text(json.dumps(
            {"dims": dims, "config": config.__dict__, "seconds": time.perf_counter() - t0}, indent=1))
    return str(path)


def collect_trajectories(model_path: str, records, *, samples: int = 8, temperature: float = 0.5,
                         max_new_tokens: int = 8, seed: int = 0, reward: str = "exact_numeric",
                         model=None) -> list[PromptTrajectories]:
    """K responses per record sampled by the hf backend, scored by the task's verifiable reward.

    ``model`` given: sample from these in-memory weights (a training checkpoint) with the
    tokenizer of ``model_path``; the behavior log-probs are then this model's.
    """
    from cropi.rewards import get_reward, score_responses

    tok = load_tokenizer(model_path)
    prompts = [render_prompt(tok, r.prompt) for r in records]
    cfg = SamplingConfig(samples=samples, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens,
                         seed=seed)
    if model is None:
        with make_backend("hf", model_path) as backend:
            outs = backend.generate(prompts, [r.prompt_id for r in records], cfg)
    else:
        outs = _generate_in_memory(model, model_path, prompts, [r.prompt_id for r in records], cfg)
    fn = get_reward(reward)
    trajs = []
    for r, p, got in zip(records, prompts, outs):
        rewards = score_responses(fn, [s.text for s in got], r.answer, timeout_s=None)
        trajs.append(PromptTrajectories(prompt_id=r.prompt_id, prompt_token_ids=p,
                                        responses=[s.token_ids for s in got],
                                        behavior_logprobs=[s.logprobs for s in got], rewards=rewards,
                                        finish_reasons=[s.finish_reason for s in got], texts=[s.text for s in got]))
    return trajs


def _generate_in_memory(model, model_path, prompts, keys, cfg):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # the hf backend loads a folder: save the checkpoint there
        model.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(model_path).save_pretrained(tmp)
        with make_backend("hf", tmp) as backend:
            return backend.generate(prompts, keys, cfg)


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


def report_items(items: list[str]) -> list[tuple[str, dict]]:
    """``TASK=path/to/report.json`` items (a reading script's ``--report``): (task, the report), in the given order."""
    return [(task, json.loads(Path(path).read_text())) for task, path in (item.split("=", 1) for item in items)]


def report_pairs(items: list[str]) -> dict[str, tuple[dict, dict]]:
    """``TASK=new/report.json:old/report.json`` items (a comparing script's ``--task``): task -> (new, old)."""
    pairs = {}
    for item in items:
        task, _, paths = item.partition("=")
        new, _, old = paths.partition(":")
        pairs[task] = (json.loads(Path(new).read_text()), json.loads(Path(old).read_text()))
    return pairs


def task_reports(items: list[str]) -> dict[str, dict]:
    """``report_items`` as task -> the report."""
    return dict(report_items(items))


def emit(out: Path | None, name: str, result: dict, shown: str) -> dict:
    """A reading script's end: ``result`` as ``out/name`` where ``--out`` was given, its ``shown`` part printed."""
    if out:
        write_json(out, name, result)
    print(json.dumps(result[shown], indent=1))
    return result


def interleaved(fns: dict, items: list, chunk: int) -> dict[str, list[float]]:
    """Each side's seconds per chunk of ``items``: every side runs every chunk, the sides' order rotating
    from chunk to chunk, so load on a shared machine hits all of them alike."""
    seconds = {name: [] for name in fns}
    names = list(fns)
    for r, start in enumerate(range(0, len(items), chunk)):
        part = items[start:start + chunk]
        for name in names[r % len(names):] + names[:r % len(names)]:
            s = time.perf_counter()
            fns[name](part)
            seconds[name].append(time.perf_counter() - s)
    return seconds


def plain_fwd_bwd(model, traj, budget: int, pad_id: int) -> None:
    """The reference every scoring speed is measured against: forward and backward over the prompt's
    micro-batches with a trivial loss (the responses' summed log-probs), every weight gradient formed,
    on the model's device."""
    from cropi.gradients.batching import build_micro_batch, plan_micro_batches

    device = next(model.parameters()).device
    lengths = [len(traj.prompt_token_ids) + len(r) for r in traj.responses]
    for idx in plan_micro_batches(lengths, budget):
        mb = build_micro_batch(list(traj.prompt_token_ids), traj.responses, traj.behavior_logprobs, idx, pad_id)
        out = model(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device),
                    position_ids=mb.position_ids.to(device), logits_to_keep=mb.targets.shape[1] + 1, use_cache=False)
        targets = mb.targets.to(device)
        logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, targets[..., None]).squeeze(-1)
        (-(logp * mb.response_mask.to(device)).sum()).backward()
    model.zero_grad(set_to_none=True)
