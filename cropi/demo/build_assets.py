"""``python -m cropi.demo.build_assets``: rebuild the shipped warm-started demo model.

Runs the supervised warm-start (cropi.demo.warmstart) by the recipe in
cropi.demo.assets, measures the model's greedy accuracy on the demo's test split,
and writes both into ``cropi/demo/assets/warmstart-tiny/warmstart.json``.
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
    p.add_argument("--steps", type=int, default=RECIPE.steps, help="supervised steps")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # deterministic, and the fastest for a model this small
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        doc = build_model(Path(tmp) / "model", replace(RECIPE, steps=a.steps), log=_say)
        doc["test_accuracy"] = _test_accuracy(Path(tmp) / "model")
        (Path(tmp) / "model" / RECIPE_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        out = Path(a.out)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(Path(tmp) / "model", out)
    _say(f"wrote {out} in {time.perf_counter() - started:.0f}s: {json.dumps(doc['test_accuracy'])}")
    return 0


def _test_accuracy(model: Path) -> dict:
    from cropi.demo.evaluate import evaluate
    from cropi.demo.settings import DemoSettings
    from cropi.tasks.arithmetic import make_task_splits

    s = DemoSettings()
    splits = make_task_splits(s.task_seed, pool_size=s.pool_size, val_size=s.val_size, test_size=s.test_size)
    out = {}
    for name in ("test", "pool"):
        result = evaluate(model, splits[name][:400], reward=s.reward, max_new_tokens=s.max_new_tokens)
        out[name] = {"accuracy": result["accuracy"], "by_skill": result["by_group"], "n": result["n"]}
    return out


def _say(msg: str) -> None:
    print(f"[build_assets] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
