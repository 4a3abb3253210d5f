"""``python -m cropi.demo.build_assets --task NAME``: rebuild a task's shipped warm-started model.

Runs the supervised warm-start (cropi.models.warmstart) by the task's recipe, measures the
model's accuracy (greedy, sampled mean@8, pass@8) on the task's test splits and the pool,
and writes both into ``cropi/demo/assets/warmstart-<task>/warmstart.json``.

``--scan`` is how a recipe's ``stop_at`` is found: it evaluates every test split the task
has at a snapshot every 100 steps and stops at the first snapshot where at least two
skills meet the warm-start criteria (``meets_criteria``; docs/demo.md), writing every
snapshot's figures to ``--scan-out``. The model it stops at is the one a plain build with
that ``stop_at`` gives, bit for bit (the snapshots do not touch the training stream).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from cropi.demo.assets import RECIPE_FILE, asset_dir, build_model, recipe
from cropi.tasks.base import DEFAULT_TASK, POOL, Task, load_task

EVAL_SAMPLES = 8
# Warm-start design criteria of a targeted skill (docs/demo.md), fixed before any scan was run.
SAMPLED_RANGE = (0.20, 0.50)
GREEDY_ABOVE = 0.10   # greedy at least this far above sampled mean@8
PASS_ABOVE = 0.25     # pass@8 at least this far above sampled mean@8


def meets_criteria(result: dict) -> bool:
    """Whether one test split's evaluation is in the design range for a targeted skill."""
    sampled = result[f"mean@{EVAL_SAMPLES}"]
    return (SAMPLED_RANGE[0] <= sampled <= SAMPLED_RANGE[1] and result["greedy"] >= sampled + GREEDY_ABOVE
            and result[f"pass@{EVAL_SAMPLES}"] >= sampled + PASS_ABOVE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cropi.demo.build_assets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default=DEFAULT_TASK, help="built-in task name or module:attribute")
    p.add_argument("--out", help="model folder to (re)write (default: the task's shipped asset folder)")
    p.add_argument("--stop-at", type=int, help="supervised steps run (default: the recipe's stop_at)")
    p.add_argument("--scan", action="store_true", help="find stop_at: evaluate a snapshot every 100 steps")
    p.add_argument("--scan-out", help="JSON file for the scan's snapshots")
    a = p.parse_args(argv)
    from cropi.demo.work import init_worker

    init_worker()  # the demo's thread policy: the evaluations below count what `cropi demo` would measure
    task = load_task(a.task)
    config = recipe(task, **({"stop_at": a.stop_at} if a.stop_at is not None else {}))
    if a.scan:
        config = recipe(task, stop_at=None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        scan = _Scan(task, folder) if a.scan else None
        doc = build_model(folder, task, config, log=_say, snapshot=scan)
        if scan is not None:
            doc["recipe"]["stop_at"] = doc["steps"]
            _write_scan(a.scan_out, task, scan, doc)
        doc["test_accuracy"] = test_accuracy(task, folder)
        (folder / RECIPE_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        out = Path(a.out) if a.out else asset_dir(task)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(folder, out)
    _say(f"wrote {out} in {time.perf_counter() - started:.0f}s after {doc['steps']} steps")
    return 0


class _Scan:
    """The snapshot callback: every test split evaluated; stop once two skills meet the criteria."""

    def __init__(self, task: Task, folder: Path):
        self.task, self.folder, self.rows = task, folder, []
        self.splits = task.splits()

    def __call__(self, step: int, model, tokenizer) -> bool:
        from cropi.generation.hf import HFBackend
        from cropi.generation.stopping import stop_token_ids

        backend = HFBackend.from_model(model, tokenizer, stop_token_ids(self.folder, tokenizer), max_batch_rows=512)
        result = _evaluate(self.task, self.splits, backend, tokenizer, _test_splits(self.task))
        qualifying = sorted(name for name, r in result.items() if meets_criteria(r))
        self.rows.append({"step": step, "qualifying": qualifying, "splits": result})
        _say(f"snapshot {step}: " + ", ".join(f"{n} {r['mean@8']:.2f}/{r['greedy']:.2f}/{r['pass@8']:.2f}"
                                              for n, r in result.items()) + f"; in range: {qualifying}")
        return len(qualifying) >= 2


def _test_splits(task: Task) -> list[str]:
    return [s for s in task.sizes if s.startswith("test")] or task.test_splits()


def _evaluate(task: Task, splits: dict, backend, tokenizer, names: list[str]) -> dict:
    from cropi.generation.evaluate import EvalSet, evaluate_policy
    from cropi.rewards import get_reward

    out = {}
    for name in names:
        data = EvalSet.build(name, splits[name], tokenizer)
        out[name] = evaluate_policy(backend, data, get_reward(task.reward), samples=EVAL_SAMPLES,
                                    max_new_tokens=task.max_new_tokens, group_key="skill" if name == POOL else "level")
    return out


def test_accuracy(task: Task, model: Path) -> dict:
    """Greedy, mean@8 and pass@8 of ``model`` on the task's test splits and its pool."""
    from cropi.generation.hf import HFBackend

    with HFBackend(model, max_batch_rows=512) as backend:
        return _evaluate(task, task.splits(), backend, backend.tokenizer, _test_splits(task) + [POOL])


def _write_scan(path: str | None, task: Task, scan: _Scan, doc: dict) -> None:
    if not path:
        return
    report = {"task": task.name, "criteria": {"sampled_range": SAMPLED_RANGE, "greedy_above": GREEDY_ABOVE,
                                              "pass_above": PASS_ABOVE, "samples": EVAL_SAMPLES},
              "recipe": doc["recipe"], "stop_at": doc["steps"],
              "snapshots": [{**r, "splits": {n: {k: v for k, v in e.items() if k != "by_group"}
                                             for n, e in r["splits"].items()}} for r in scan.rows]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1) + "\n")


def _say(msg: str) -> None:
    print(f"[build_assets] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
