"""Stands in for verl's trainer and model merger as far as cropi's launcher can see (no GPU here), in verl's
real layout, for tests/test_verl.py and tests/test_check.py.

Run as ``python verl_standin.py REAL_PYTHON ARGS...`` (``standin(folder)`` writes the launcher). ``-m
verl.trainer.main_ppo``: resumes from ``latest_checkpointed_iteration.txt``, "trains" by adding ``STEP_DELTA``
to every weight per global step, and saves ``global_step_N/actor/{model_world_size_1_rank_0.pt,
fsdp_config.json, huggingface/}`` and ``global_step_N/data.pt``, then the tracker (verl's order). ``-m
verl.model_merger merge``: writes a Hugging Face folder. Anything else (the launcher's flash-attn probe) runs
on the real interpreter. Environment:

- ``STANDIN_LOG``: a JSON line per training launch (start, end, whether data.pt was there, train_files); every
  launch's overrides also go into ``calls.jsonl`` in its run folder (``_data_pt_at_start`` added);
- ``FAKE_VERL_FAIL``: main_ppo prints a CUDA error and exits with status 3;
- ``FAKE_VERL_KILL`` = ``<point>@<step>``: SIGKILL itself there: before_save, during_save, after_save
  (main_ppo) or merge (the merger, after writing part of the target);
- ``STANDIN_HURT`` = ``<file name>@<step>``: on a train file of that name, every global step after ``<step>``
  subtracts ``HURT`` deltas instead of adding one (a subset that helps, then hurts).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

STEP_DELTA = 1e-3
HURT = 5


def standin(folder: Path) -> Path:
    """An executable that runs this script on this interpreter: pass it as ``VerlOptions.python``."""
    launcher = Path(folder) / "verl-python"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "{sys.executable}" "$@"\n')
    launcher.chmod(0o755)
    return launcher


def _overrides(args: list[str]) -> dict[str, str]:
    """``key=value`` Hydra overrides as strings (cropi's quoting: hydra_value), without Hydra's parser so the
    stand-in also runs where verl (and Hydra) are not installed."""
    out = {}
    for a in args:
        key, _, value = a.partition("=")
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("\\'", "'").replace("\\\\", "\\")
        out[key.lstrip("+")] = value
    return out


def _maybe_die(point: str, step: int) -> None:
    if os.environ.get("FAKE_VERL_KILL", "") == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def _delta(train_files: str, step: int) -> float:
    name, _, after = os.environ.get("STANDIN_HURT", "").partition("@")
    if name and Path(train_files).name == name and step > int(after):
        return -HURT * STEP_DELTA
    return STEP_DELTA


def _train(args: list[str]) -> None:
    import torch

    kv = _overrides([a for a in args if a not in ("--cfg", "job")])
    if "--cfg" in args:
        print(json.dumps(kv))  # the preflight: the overrides parse
        return
    run = Path(kv["trainer.default_local_dir"])
    run.mkdir(parents=True, exist_ok=True)
    tracker = run / "latest_checkpointed_iteration.txt"
    start = int(tracker.read_text()) if tracker.exists() else 0
    end, every = int(kv["trainer.total_training_steps"]), int(kv["trainer.save_freq"])
    data_pt = (run / f"global_step_{start}" / "data.pt").exists()
    with open(run / "calls.jsonl", "a") as f:
        f.write(json.dumps(kv | {"_data_pt_at_start": data_pt}) + "\n")
    if os.environ.get("STANDIN_LOG"):
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write(json.dumps({"start": start, "end": end, "run": str(run), "data_pt": data_pt,
                                "train_files": kv["data.train_files"]}) + "\n")
    if os.environ.get("FAKE_VERL_FAIL"):
        print("CUDA error: no GPU")
        sys.exit(3)
    hf = Path(kv["actor_rollout_ref.model.path"])
    if start:
        state = torch.load(run / f"global_step_{start}" / "actor" / "model_world_size_1_rank_0.pt")
    else:
        from safetensors.torch import load_file
        state = load_file(str(hf / "model.safetensors"))
    for step in range(start + 1, end + 1):
        delta = _delta(kv["data.train_files"], step)
        state = {k: v + delta for k, v in state.items()}
        with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as f:
            f.write(json.dumps({"step": step, "data": {"critic/score/mean": step / 10, "actor/pg_loss": -step}}) + "\n")
        if step % every and step != end:
            continue
        _maybe_die("before_save", step)
        actor = run / f"global_step_{step}" / "actor"
        (actor / "huggingface").mkdir(parents=True, exist_ok=True)
        torch.save(state, actor / "model_world_size_1_rank_0.pt")
        _maybe_die("during_save", step)
        (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
        for f in hf.iterdir():
            if f.suffix != ".safetensors" and f.is_file():
                shutil.copy(f, actor / "huggingface" / f.name)
        torch.save({"sampler": step}, actor.parent / "data.pt")
        tracker.write_text(str(step))
        _maybe_die("after_save", step)


def _merge(args: list[str]) -> None:
    import torch
    from safetensors.torch import save_file

    local, target = Path(args[args.index("--local_dir") + 1]), Path(args[args.index("--target_dir") + 1])
    shutil.copytree(local / "huggingface", target, dirs_exist_ok=True)
    state = torch.load(local / "model_world_size_1_rank_0.pt")
    save_file({k: v.clone().contiguous() for k, v in state.items()}, str(target / "model.safetensors"))
    _maybe_die("merge", int(local.parent.name.split("_")[-1]))


if __name__ == "__main__":
    real, rest = sys.argv[1], sys.argv[2:]
    if rest[:2] == ["-m", "verl.trainer.main_ppo"]:
        _train(rest[2:])
    elif rest[:3] == ["-m", "verl.model_merger", "merge"]:
        _merge(rest[3:])
    else:
        os.execv(real, [real, *rest])
