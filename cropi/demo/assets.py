"""The demo's warm-started models: shipped with the package per built-in task, or built from a task's recipe.

Warm-starting takes longer than the whole ``--quick`` budget on 2 CPU cores, so the
package ships each built-in task's result (``assets/warmstart-<task>``, about 2 MB of
safetensors) and ``python -m cropi.demo.build_assets --task NAME`` rebuilds it,
deterministically, from the task's recipe (``Task.warm_start``). A task without a
shipped model (one defined outside the package) gets its model built from its recipe.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Optional

from cropi.data.records import PromptRecord, prompts_fingerprint
from cropi.errors import NotFoundError
from cropi.models.warmstart import Snapshot, WarmStartConfig, warm_start
from cropi.tasks.base import BUILTIN, WARMSTART, Task, load_task

ASSETS = Path(__file__).resolve().parent / "assets"
RECIPE_FILE = "warmstart.json"
# The task the benchmarks and tests measure on when they name none (their committed figures are on it).
BENCHMARK_TASK = "skills"
TaskLike = Task | str


def _task(task: TaskLike) -> Task:
    return task if isinstance(task, Task) else load_task(task)


def asset_dir(task: TaskLike = BENCHMARK_TASK) -> Path:
    task = _task(task)
    return ASSETS / f"warmstart-{task.model_of or task.name}"


def recipe(task: TaskLike = BENCHMARK_TASK, **overrides) -> WarmStartConfig:
    return WarmStartConfig(**(dict(_task(task).warm_start) | overrides))


def shipped_model(task: TaskLike = BENCHMARK_TASK) -> Path:
    """A built-in task's shipped model folder; NotFoundError says how to build it."""
    found = _shipped(_task(task))
    if found is None:
        raise NotFoundError(f"no shipped warm-started model for task {_task(task).name!r} at {asset_dir(task)}: "
                            "build it with `python -m cropi.demo.build_assets --task NAME`, or run the demo "
                            "with --warm-start")
    return found


def _shipped(task: Task) -> Optional[Path]:
    return _start(task)[0]


def _start(task: Task) -> tuple[Optional[Path], Optional[str]]:
    """The shipped model that is ``task``'s initial model: a built-in task's own, or, for a task defined elsewhere
    whose ``model_of`` names a built-in one (a remix of `lists`, say), that task's, where the shipped model's
    recipe, warm-start prompts and answers are the task's own (``starts_as_shipped``); else None, and why not
    where the task names a ``model_of`` whose shipped model exists."""
    folder = asset_dir(task)
    if not (folder / "config.json").is_file():
        return None, None
    why = None if task.name in BUILTIN else starts_as_shipped(task, folder)
    return (None, why if task.model_of else None) if why else (folder, None)


def starts_as_shipped(task: Task, folder: Path) -> Optional[str]:
    """Why the shipped model in ``folder`` is not what ``task``'s recipe builds (None: it is). The recipe is
    deterministic, but its float bits are the building machine's kernels': on another machine a model built now
    differs from the shipped one (measured: a `lists` remix defined outside the package ended its warm start at
    loss 0.721 on this Intel Xeon against the shipped model's 0.769), so every task that names the same start
    takes the shipped model rather than a machine's own rebuild of it."""
    if task.model_of not in BUILTIN:
        return f"its model_of {task.model_of!r} is not a built-in task" if task.model_of else "it names no model_of"
    shipped = json.loads((folder / RECIPE_FILE).read_text())
    if recipe(task).__dict__ != shipped["recipe"]:
        return f"its warm-start recipe is not that of the shipped {task.model_of} model"
    records = warmstart_records(task)
    if prompts_fingerprint(records) != shipped["prompts_fingerprint"]:
        return f"its warm-start prompts are not those of the shipped {task.model_of} model"
    base = load_task(task.model_of)
    if any(task.response_text(r) != base.response_text(r) for r in records):
        return f"its warm-start answers (response_text) are not those of the shipped {task.model_of} model"
    return None


def task_splits(task: TaskLike = BENCHMARK_TASK) -> dict[str, list[PromptRecord]]:
    """The task drawn at its full sizes: every demo split is a prefix of one of these."""
    return _task(task).splits()


def build_model(out_dir: str | Path, task: TaskLike = BENCHMARK_TASK, config: WarmStartConfig | None = None, *,
                log: Optional[Callable[[str], None]] = None, snapshot: Snapshot | None = None) -> dict:
    """Warm-start a tiny model into ``out_dir`` by the task's recipe; writes the recipe and summary beside it."""
    task = _task(task)
    config = config or recipe(task)
    records = warmstart_records(task)
    summary = warm_start(out_dir, records, config, answer=task.response_text, log=log, snapshot=snapshot)
    doc = {"task": task.name, "recipe": config.__dict__, "task_seed": task.seed, "task_sizes": dict(task.sizes),
           "prompts": len(records), "prompts_fingerprint": prompts_fingerprint(records), **summary}
    (Path(out_dir) / RECIPE_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def warmstart_records(task: TaskLike = BENCHMARK_TASK) -> list[PromptRecord]:
    """The supervised set of the task's initial model: drawn after every demo split, so it shares none."""
    return task_splits(task)[WARMSTART]


def place_model(out_dir: str | Path, task: Task, *, warm_start_now: bool = False,
                log: Optional[Callable[[str], None]] = None) -> Path:
    """Put the initial model of a demo run at ``out_dir``: the shipped one, or one warm-started now."""
    out = Path(out_dir)
    shipped, why = _start(task)
    if shipped is not None and not warm_start_now:
        if log and task.name not in BUILTIN:
            log(f"the {task.name!r} task's initial model is the shipped {task.model_of} model (model_of: the same "
                "recipe, warm-start prompts and answers)")
        return copy_model(shipped, out)
    if (out / RECIPE_FILE).is_file() and json.loads((out / RECIPE_FILE).read_text()).get("task") == task.name:
        return out  # built by an earlier, interrupted run of this demo
    if log:
        log(f"warm-starting the {task.name!r} task's initial model from its recipe "
            f"({'as asked' if warm_start_now else f'no shipped model: {why}' if why else 'no shipped model'})")
    # warm_start runs at TORCH_THREADS whatever this process's count (the demo places the model in its
    # main process, before any worker starts): the same model as build_assets and the probe benchmark build
    build_model(out, task, log=log)
    return out


def copy_model(src: str | Path, dst: str | Path) -> Path:
    """Copy a model folder over ``dst`` (replacing what was there)."""
    dst = Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


RECIPE = recipe()  # the benchmark task's recipe (benchmarks derive their larger models from it)
