"""GRPO trainer speed on the demo's model: the lean loop against trl's GRPOTrainer, side by side.

Both train the shipped warm-started demo model on the demo's pool with the same GRPO
settings (8 prompts x 8 rollouts a step, 4 new tokens, lr 3e-4, no KL), the real
``exact_numeric`` reward on the sampled responses, one torch thread each, run one
after the other in this process. Reported: seconds per step and completions per
second of each, and their ratio.

    python benchmarks/trainer_speed.py [--steps 30] --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

SETTINGS = dict(lr=3e-4, batch_prompts=8, rollouts=8, max_new_tokens=4, kl_coef=0.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="benchmarks/results")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        subset = _subset(Path(tmp))
        results = {name: _run(name, subset, Path(tmp) / name, a.steps) for name in ("lean", "trl")}
    doc = {"benchmark": "trainer_speed", "model": "cropi demo warm-start (tiny Qwen2, shipped)",
           "settings": SETTINGS | {"steps": a.steps, "torch_threads": 1}, "machine": platform.processor() or
           platform.machine(), "results": results,
           "lean_speedup": results["trl"]["seconds_per_step"] / results["lean"]["seconds_per_step"]}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trainer_speed.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


def _subset(folder: Path) -> str:
    from cropi.data import write_verl_parquet
    from cropi.demo.assets import task_splits

    path = folder / "pool.parquet"
    write_verl_parquet(task_splits()["pool"], str(path))
    return str(path)


def _run(name: str, subset: str, out: Path, steps: int) -> dict:
    from cropi.demo.assets import shipped_model
    from cropi.trainers import make_trainer

    options = dict(SETTINGS)
    if name == "trl":
        options["temperature"] = 1.0
    trainer = make_trainer(name, **options)
    began = time.perf_counter()
    result = trainer.train_stage(model=str(shipped_model()), subset=subset, out_dir=str(out), steps=steps, seed=0,
                                 stage=0, reward="exact_numeric")
    wall = time.perf_counter() - began
    completions = steps * SETTINGS["batch_prompts"] * SETTINGS["rollouts"]
    return {"steps": result.steps_done, "wall_s": round(wall, 2), "seconds_per_step": wall / steps,
            "completions_per_s": completions / wall, "reward_first": result.metrics.get("reward_first"),
            "reward_last": result.metrics.get("reward_last")}


if __name__ == "__main__":
    raise SystemExit(main())
