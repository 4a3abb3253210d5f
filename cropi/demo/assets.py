"""The demo's warm-started model: shipped with the package, or built on request.

Warm-starting takes longer than the whole ``--quick`` budget on 2 CPU cores, so the
package ships the result (``assets/warmstart-tiny``, a few MB of safetensors) and
``python -m cropi.demo.build_assets`` rebuilds it, deterministically, from the
recipe below.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Optional

from cropi.data.records import PromptRecord, prompts_fingerprint
from cropi.errors import NotFoundError
from cropi.tasks.arithmetic import make_task_splits
from cropi.demo.warmstart import WarmStartConfig, warm_start

ASSETS = Path(__file__).resolve().parent / "assets"
MODEL_NAME = "warmstart-tiny"
RECIPE_FILE = "warmstart.json"
WARMSTART_TASK_SEED = 101  # its problems are drawn apart from every demo split (see warmstart_records)
WARMSTART_PROMPTS = 10000
RECIPE = WarmStartConfig(size="tiny", steps=5000, batch_size=32, lr=3e-3, seed=0)


def shipped_model() -> Path:
    """The shipped warm-started model folder; NotFoundError says how to build it."""
    folder = ASSETS / MODEL_NAME
    if not (folder / "config.json").is_file():
        raise NotFoundError(f"the demo's warm-started model is missing from {folder}: build it with "
                            "`python -m cropi.demo.build_assets`, or run the demo with --warm-start")
    return folder


def demo_heldout_ids() -> set[str]:
    """Prompt ids of every split the demo draws at its default task seed (full and quick sizes)."""
    from cropi.demo.settings import DemoSettings

    ids: set[str] = set()
    for s in (DemoSettings(), DemoSettings.quick()):
        splits = make_task_splits(s.task_seed, pool_size=s.pool_size, val_size=s.val_size, test_size=s.test_size)
        ids |= {r.prompt_id for records in splits.values() for r in records}
    return ids


def warmstart_records(n: int = WARMSTART_PROMPTS) -> list[PromptRecord]:
    """The supervised set: problems of every skill and level, none of them in a demo split.

    The demo splits depend on DemoSettings' sizes: change those and this set changes, so the
    shipped model must be rebuilt (a test compares the shipped ``prompts_fingerprint``).
    """
    drawn = make_task_splits(WARMSTART_TASK_SEED, pool_size=n, val_size=2, test_size=2)["pool"]
    heldout = demo_heldout_ids()
    return [r for r in drawn if r.prompt_id not in heldout]


def build_model(out_dir: str | Path, config: WarmStartConfig = RECIPE, *,
                log: Optional[Callable[[str], None]] = None) -> dict:
    """Warm-start a tiny model into ``out_dir`` by the recipe; writes the recipe and summary beside it."""
    records = warmstart_records()
    summary = warm_start(out_dir, records, config, log=log)
    doc = {"recipe": config.__dict__, "task_seed": WARMSTART_TASK_SEED, "prompts": len(records),
           "prompts_fingerprint": prompts_fingerprint(records), **summary}
    (Path(out_dir) / RECIPE_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def place_model(out_dir: str | Path, *, warm_start_now: bool = False,
                log: Optional[Callable[[str], None]] = None) -> Path:
    """Put the initial model of a demo run at ``out_dir``: the shipped one, or a fresh warm-start."""
    out = Path(out_dir)
    if warm_start_now:
        build_model(out, log=log)
        return out
    return copy_model(shipped_model(), out)


def copy_model(src: str | Path, dst: str | Path) -> Path:
    """Copy a model folder over ``dst`` (replacing what was there)."""
    dst = Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst
