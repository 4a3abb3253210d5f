"""``python -m cropi.demo.build_assets``: rebuild the shipped warm-started demo model.

Runs the supervised warm-start (cropi.models.warmstart) by the recipe in
cropi.demo.assets, measures the model's accuracy (greedy, sampled mean@8, pass@8) on
the targeted test splits and the pool, and writes both into
``cropi/demo/assets/warmstart-skills/warmstart.json``. About 20 s on one core.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cropi.demo.assets import ASSETS, MODEL_NAME, RECIPE, RECIPE_FILE, build_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cropi.demo.build_assets", description=__doc__)
    p.add_argument("--out", default=str(ASSETS / MODEL_NAME), help="model folder to (re)write")
    p.add_argument("--stop-at", type=int, default=RECIPE.stop_at, help="supervised steps run (of the schedule)")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # deterministic, and the fastest for a model this small
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        doc = build_model(Path(tmp) / "model", replace(RECIPE, stop_at=a.stop_at), log=_say)
        doc["test_accuracy"] = _test_accuracy(Path(tmp) / "model")
        (Path(tmp) / "model" / RECIPE_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        out = Path(a.out)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(Path(tmp) / "model", out)
    _say(f"wrote {out} in {time.perf_counter() - started:.0f}s: {json.dumps(doc['test_accuracy'])}")
    return 0


def _test_accuracy(model: Path) -> dict:
    from cropi.generation.evaluate import EvalSet, evaluate_policy
    from cropi.generation.hf import HFBackend
    from cropi.rewards import get_reward
    from cropi.demo.assets import task_splits
    from cropi.tasks.skills import TARGETS

    splits = task_splits()
    out = {}
    with HFBackend(model, max_batch_rows=512) as backend:
        for name in [test for _, test in TARGETS.values()] + ["pool"]:
            data = EvalSet.build(name, splits[name], backend.tokenizer)
            result = evaluate_policy(backend, data, get_reward("exact_numeric"), samples=8, max_new_tokens=4,
                                     group_key="skill" if name == "pool" else "level")
            out[name] = result
    return out


def _say(msg: str) -> None:
    print(f"[build_assets] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
