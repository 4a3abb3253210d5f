"""The three steps of a curriculum stage: score ``theta_m``, select the stage subset, train.

1. score:  CROPI: the score step (``cropi.pipeline.score``) at ``theta_m`` over the
           behavior policy's trajectories: gradients of the pool and the validation
           sets, the fused ranking and its selection, stored once in the store (with
           ``refresh``, part of the pool re-collected at ``theta_m`` first).
           ``pass_rate``: ``p (1 - p)`` per pool prompt from the trajectories; ``informative``:
           a random fraction of the prompts whose offline rewards are mixed.
           ``random`` / ``full``: nothing to score.
2. select: the stage subset (the ranking's selection, a random fraction, or the whole
           pool), written as verl RLVR parquet.
3. train:  the trainer trains ``theta_m`` on the subset; its checkpoint is ``theta_{m+1}``.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from cropi.contracts import POOL
from cropi.data import PromptRecord, load_prompts, write_verl_parquet
from cropi.errors import InvalidInputError
from cropi.pipeline import baselines
from cropi.pipeline.curriculum.config import MAX_STAGES, CurriculumConfig
from cropi.pipeline.curriculum.state import CurriculumPaths
from cropi.pipeline.rank import pool_labels
from cropi.scoring.diagnostics import selection_mix
from cropi.pipeline.progress import Progress
from cropi.pipeline.score import ensure_trajectories, score_checkpoint
from cropi.store import TrajectoryStore
from cropi.utils.fingerprint import model_fingerprint
from cropi.utils.fsio import atomic_write_bytes, resolve, write_json_atomic


@dataclass
class StageScore:
    """Step 1's record for state.json, and the selection it implies (None: the method draws it)."""

    record: dict
    chosen: Optional[list[str]]


def score(config: CurriculumConfig, paths: CurriculumPaths, m: int, model: str, progress: Progress) -> StageScore:
    if config.method in ("full", "random", "oracle"):
        return StageScore({"model": model, "ranking": None}, None)
    behavior = model if config.recollect_each_stage else str(Path(config.model).resolve())
    request = config.score_request(model, behavior)
    if config.method in ("pass_rate", "informative"):
        trajectories = ensure_trajectories(request, paths.root, progress)
        rates = _pass_rates(trajectories[POOL])
        out = paths.stage(m) / "ranking.parquet"  # the pass rates: these methods' only record of their scores
        _write_table(out, _pass_rate_table(rates))
        if config.method == "pass_rate":
            chosen = baselines.select_pass_rate(_pool_ids(config), rates, config.select_fraction, seed=config.seed)
        else:
            chosen = baselines.select_informative(_pool_ids(config), rates, config.select_fraction, seed=config.seed,
                                                  stage=m)
        return StageScore({"model": model, "behavior": behavior, "ranking": str(out),
                           "trajectories": trajectories}, chosen)
    result = score_checkpoint(request, root=paths.root, progress=progress, refresh=config.refresh)
    record = {"model": model, "behavior": behavior, "ranking": result.ranking, "checkpoint": result.name,
              "spec_id": result.spec_id, "trajectories": result.trajectories}
    if result.refreshed is not None:
        record["refreshed"] = len(result.refreshed)
    return StageScore(record, result.selected)


def select(config: CurriculumConfig, paths: CurriculumPaths, m: int, pool: dict[str, PromptRecord],
           chosen: Optional[list[str]]) -> dict:
    """Write the stage subset: ``chosen`` (best first), or the method's own draw."""
    if config.method == "full":
        chosen = baselines.select_full(list(pool))
    elif config.method == "random":
        chosen = baselines.select_random(list(pool), config.select_fraction, seed=config.seed, stage=m)
    elif config.method == "oracle":
        chosen = baselines.select_oracle(pool, [r for path in config.validation.values() for r in load_prompts(path)])
    if not chosen:
        raise InvalidInputError(f"stage {m} of {config.name!r} selected no prompts: every pool prompt was "
                                "excluded (see the ranking's status counts); check the trajectories' rewards")
    missing = [p for p in chosen if p not in pool]
    if missing:
        raise InvalidInputError(f"the stage selection holds {len(missing)} prompts the pool file lacks (e.g. "
                                f"{missing[:3]}); the pool file changed after scoring: start a new curriculum")
    subset = paths.stage(m) / "subset.parquet"
    write_verl_parquet([pool[p] for p in chosen], str(subset), split="train")
    mix = selection_mix(chosen, pool_labels(pool.values()))
    return {"subset": str(subset), "n_prompts": len(chosen), "pool_size": len(pool), "diagnostics": mix}


def train(config: CurriculumConfig, paths: CurriculumPaths, m: int, model: str, subset: str, trainer) -> dict:
    out = paths.stage(m) / "train"
    if out.exists():  # a run killed mid-stage: train the stage again from its start
        shutil.rmtree(out)
    result = trainer.train_stage(model=model, subset=subset, out_dir=str(out), steps=config.steps_per_stage,
                                 seed=stage_seed(config.seed, m), stage=m, reward=config.reward)
    return {"checkpoint": result.checkpoint, "fingerprint": model_fingerprint(result.checkpoint),
            "steps_done": result.steps_done, "global_step": result.global_step,
            "metrics": _finite(result.metrics), "log": result.log_path, "metrics_path": result.metrics_path}


def write_metrics(paths: CurriculumPaths, m: int, stage: dict) -> None:
    doc = {"index": m, "selected": stage["selected"], "trained": stage["trained"],
           "ranking": stage["scored"].get("ranking")}
    fs, path = resolve(str(paths.stage(m) / "metrics.json"))
    write_json_atomic(fs, path, doc)


def stage_seed(seed: int, m: int) -> int:
    """The trainer's seed at stage ``m``: distinct per stage so stages do not replay one random stream."""
    return seed * MAX_STAGES + m


def _pool_ids(config: CurriculumConfig) -> list[str]:
    from cropi.data import load_prompts

    return [r.prompt_id for r in load_prompts(config.pool)]


def _pass_rates(trajectories: str) -> dict[str, float]:
    store = TrajectoryStore.open(trajectories)
    return baselines.pass_rates((t.prompt_id, t.rewards) for t in store.iter_prompts())


def _pass_rate_table(rates: dict[str, float]) -> pa.Table:
    ids = sorted(rates)
    return pa.table({"prompt_id": ids, "pass_rate": [rates[p] for p in ids],
                     "score": [baselines.pass_rate_score(rates[p]) for p in ids]})


def _write_table(path: Path, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    fs, p = resolve(str(path))
    atomic_write_bytes(fs, p, sink.getvalue().to_pybytes())


def _finite(metrics: dict) -> dict:
    """Metrics with NaN / inf as None: state.json is strict JSON."""
    return {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}
