"""The demo's warm-started model: shipped with the package, or built on request.

Warm-starting takes longer than the whole ``--quick`` budget on 2 CPU cores, so the
package ships the result (``assets/warmstart-skills``, under 2 MB of safetensors) and
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
from cropi.tasks.skills import make_splits
from cropi.models.warmstart import WarmStartConfig, warm_start

ASSETS = Path(__file__).resolve().parent / "assets"
MODEL_NAME = "warmstart-skills"
RECIPE_FILE = "warmstart.json"
TASK_SEED = 0
# Every demo split is a prefix of these; the warm-start set is drawn after them, so it
# shares no problem with any split the demo can ask for.
TASK_SIZES = {"test_count": 200, "test_maxd": 200, "val_count": 100, "val_maxd": 100, "pool": 1200,
              "warmstart": 3000}
# The schedule runs over ``steps``; training stops at ``stop_at``, the first snapshot whose
# targeted skills' sampled accuracy reached the design range (docs/demo.md).
RECIPE = WarmStartConfig(size="tiny", steps=4000, batch_size=64, lr=3e-3, seed=0, stop_at=100)


def shipped_model() -> Path:
    """The shipped warm-started model folder; NotFoundError says how to build it."""
    folder = ASSETS / MODEL_NAME
    if not (folder / "config.json").is_file():
        raise NotFoundError(f"the demo's warm-started model is missing from {folder}: build it with "
                            "`python -m cropi.demo.build_assets`, or run the demo with --warm-start")
    return folder


def task_splits() -> dict[str, list[PromptRecord]]:
    """The task drawn at its full sizes: every demo split is a prefix of one of these."""
    return make_splits(TASK_SEED, TASK_SIZES)


def warmstart_records() -> list[PromptRecord]:
    """The supervised set of the shipped model: problems of every skill and level, in no demo split."""
    return task_splits()["warmstart"]


def build_model(out_dir: str | Path, config: WarmStartConfig = RECIPE, *,
                log: Optional[Callable[[str], None]] = None) -> dict:
    """Warm-start a tiny model into ``out_dir`` by the recipe; writes the recipe and summary beside it."""
    records = warmstart_records()
    summary = warm_start(out_dir, records, config, log=log)
    doc = {"recipe": config.__dict__, "task_seed": TASK_SEED, "task_sizes": TASK_SIZES, "prompts": len(records),
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
