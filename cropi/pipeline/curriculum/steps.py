"""The three steps of a curriculum stage: score ``theta_m``, select the stage subset, train.

1. score:  a selector that reads the ranking (``cropi``, ``positive``, ``diverse``): the score
           step (``cropi.pipeline.score``) at ``theta_m`` over the behavior policy's
           trajectories: gradients of the pool and the validation sets, the fused ranking
           and the selector's selection, stored once in the store (with ``refresh``, part of
           the pool re-collected at ``theta_m`` first). ``pass_rate`` / ``informative``: the
           pool's offline pass rates and their selection. ``full`` / ``random`` / ``oracle``:
           nothing to score.
2. select: the stage subset (``cropi.selection``: the one registry of selectors), written
           as verl RLVR parquet.
3. train:  the trainer trains ``theta_m`` on the subset; its checkpoint is ``theta_{m+1}``.
"""

from __future__ import annotations

import math
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from cropi.contracts import POOL
from cropi.data import PromptRecord, load_prompts, write_verl_parquet
from cropi.errors import CorruptDataError, InvalidInputError, NotFoundError
from cropi.pipeline.curriculum.config import MAX_STAGES, CurriculumConfig
from cropi.pipeline.curriculum.state import CurriculumPaths
from cropi.pipeline.rank import pool_labels
from cropi.scoring.diagnostics import (FILLED_TO_BATCH, SILENT_VALIDATION, concentration, field_skew,
                                      ranking_change, selection_mix)
from cropi.pipeline.progress import Progress
from cropi.pipeline.score import ensure_trajectories, reselect, score_checkpoint
from cropi.selection import SelectionInputs, filled, get_selector, pass_rate_score, pass_rates, select
from cropi.selection.influence import gains
from cropi.scoring.ranking import Ranking
from cropi.store import TrajectoryStore
from cropi.store.rankings import read_ranking
from cropi.utils.fingerprint import model_fingerprint
from cropi.utils.fsio import atomic_write_bytes, resolve, write_json_atomic


# What a ranking selector's record says of its selection, carried into the stage record.
SIGNAL = ("selection_alignment", "random_alignment", "selection_pass_rate", "pool_pass_rate")


@dataclass
class StageScore:
    """Step 1's record for state.json, and the selection it implies (None: the method draws it)."""

    record: dict
    chosen: Optional[list[str]]
    mix: Optional[dict] = None  # a ranking selector's record of its selection (cropi.pipeline.rank.selection_signal)


def score(config: CurriculumConfig, paths: CurriculumPaths, m: int, model: str, progress: Progress, *,
          write: bool = True) -> StageScore:
    needs = get_selector(config.selector).needs
    if not config.ranks and "pass_rates" not in needs:  # full, random, oracle: nothing to score
        return StageScore({"model": model, "ranking": None}, None)
    behavior = model if config.recollect_each_stage else str(Path(config.model).resolve())
    request = config.score_request(model, behavior)
    if not config.ranks:  # the pass-rate controls read theta_0's offline rewards only
        trajectories = ensure_trajectories(request, paths.root, progress)
        rates = _pass_rates(trajectories[POOL])
        out = paths.stage(m) / "ranking.parquet"  # the pass rates: these selectors' only record of their scores
        if write:
            _write_table(out, _pass_rate_table(rates))
        picked = select(config.selector, _inputs(config, m, pass_rates=rates), config.selector_options)
        return StageScore({"model": model, "behavior": behavior, "ranking": str(out), "trajectories": trajectories,
                           **picked.record()}, picked.chosen)
    result = score_checkpoint(request, root=paths.root, progress=progress, refresh=config.stage_refresh)
    record = {"model": model, "behavior": behavior, "ranking": result.ranking, "checkpoint": result.name,
              "spec_id": result.spec_id, "trajectories": result.trajectories, "selector": config.selector,
              "selector_options": config.selector_options, "replaced_by": result.replaced_by}
    if result.refreshed is not None:
        record["refreshed"] = len(result.refreshed)
    return StageScore(record, result.selected, result.diagnostics)


def select_stage(config: CurriculumConfig, paths: CurriculumPaths, m: int, pool: dict[str, PromptRecord],
                 chosen: Optional[list[str]], scored_mix: Optional[dict] = None, *, batch: int = 0,
                 scored: Optional[dict] = None, before: Optional[dict] = None) -> dict:
    """Write the stage subset: ``chosen`` (best first), or the selector's own draw, filled to one trainer's
    ``batch`` where it holds fewer (``to_a_batch``). ``scored_mix`` is the ranking's record of the selection (its
    gradients' agreement), when a ranking selector made it. ``scored`` and ``before``: this stage's and the last
    stage's step-1 records, whose rankings ``turnover`` compares."""
    if chosen is None:
        validation = [r for path in config.validation.values() for r in load_prompts(path)]
        chosen = select(config.selector, _inputs(config, m, records=pool, validation=validation),
                        config.selector_options).chosen
    if not chosen:
        raise InvalidInputError(f"stage {m} of {config.name!r} selected no prompts: every pool prompt was "
                                "excluded (see the ranking's status counts); check the trajectories' rewards")
    missing = [p for p in chosen if p not in pool]
    if missing:
        raise InvalidInputError(f"the stage selection holds {len(missing)} prompts the pool file lacks (e.g. "
                                f"{missing[:3]}); the pool file changed after scoring: start a new curriculum")
    chosen, short = to_a_batch(config, m, pool, chosen, config.selector, config.select_fraction, batch)
    subset = paths.stage(m) / "subset.parquet"
    write_verl_parquet([pool[p] for p in chosen], str(subset), split="train")
    mix = selection_mix(chosen, pool_labels(pool.values()))
    if short:
        mix["warnings"] = mix["warnings"] + [short["warning"]]
    if scored_mix:  # a ranking selector's record: how much the picks' gradients agree, judged at the trainer's batch
        signal = {k: scored_mix[k] for k in SIGNAL if k in scored_mix}
        warned = concentration(signal.get("selection_alignment"), signal.get("random_alignment"),
                               config.trainer_options.get("batch_prompts"))
        mix = mix | signal | {k: v for k, v in warned.items() if k != "warnings"}
        ranked = [w for w in scored_mix.get("warnings", []) if w.get("code") == SILENT_VALIDATION]  # not redone here
        mix["warnings"] = ranked + mix["warnings"] + warned["warnings"]
    change = turnover(scored, before, len(chosen), config.check.alpha)
    if change:
        mix = mix | {"ranking_change": {k: v for k, v in change.items() if k != "warnings"},
                     "warnings": mix["warnings"] + change["warnings"]}
    if config.skew_fields:
        fields = {f: {p: str(r.extra_info.get(f)) for p, r in pool.items()} for f in config.skew_fields}
        skew = field_skew(chosen, fields)
        mix = mix | {"fields": skew["fields"], "warnings": mix["warnings"] + skew["warnings"]}
    return {"subset": str(subset), "n_prompts": len(chosen), "pool_size": len(pool), "diagnostics": mix,
            **({"filled": short["filled"]} if short else {})}


def turnover(scored: Optional[dict], before: Optional[dict], k: int, alpha: float) -> Optional[dict]:
    """A stage's influence ranking against the last stage's (``cropi.scoring.diagnostics.ranking_change`` over
    their fused scores; ``scored`` and ``before`` the two stages' step-1 records). None where either stage has no
    influence ranking (the first stage, a selector that reads none, or only the pass rates) or a ranking file is
    gone: a diagnostic, never a reason to stop a stage."""
    if not (scored and before and scored.get("checkpoint") and before.get("checkpoint")):
        return None
    try:
        now, then = (_fused(record["ranking"]) for record in (scored, before))
    except (NotFoundError, CorruptDataError, OSError):
        return None
    return ranking_change(now, then, k, alpha)


def _fused(ranking: str) -> dict[str, float]:
    """A stored ranking's fused score of every prompt it ranked (status ok)."""
    table, _ = read_ranking(*resolve(ranking))
    ids, status, fused = (table.column(c).to_pylist() for c in ("prompt_id", "status", "fused"))
    return {p: f for p, st, f in zip(ids, status, fused) if st == "ok" and f is not None}


def batch_of(trainer) -> int:
    """The distinct prompts a step of ``trainer`` takes (0: it does not say)."""
    return int(getattr(getattr(trainer, "options", None), "batch_prompts", 0) or 0)


def fill_stream(config: CurriculumConfig, m: int, arm: str, fraction: float) -> random.Random:
    """The seeded draw that fills stage ``m``'s subset of ``arm`` at ``fraction`` (widened, or to a batch)."""
    return random.Random(f"cropi.check.fill:{config.seed}:{m}:{arm}:{fraction:g}")


def harmful(scored: dict) -> frozenset[str]:
    """The pool prompts of negative gain at a stage's ranking (``scored``: its step-1 record): the mean of their
    validation cosines, what ``positive`` and ``diverse`` read, predicts to first order that training on them lowers
    the validation objective. Empty where the stage has no influence ranking (a selector that reads none, or only
    the pass rates); a prompt the ranking does not score (status not ok: no gradient) is not among them."""
    if not scored.get("ranking") or not scored.get("checkpoint"):  # a pass-rate table names no scored checkpoint
        return frozenset()
    table, meta = read_ranking(*resolve(scored["ranking"]))
    ranking = Ranking.from_table(table, meta)
    gain = gains(SelectionInputs(prompt_ids=ranking.prompt_ids, fraction=1.0, ranking=ranking))
    return frozenset(p for p, g in zip(ranking.prompt_ids, gain) if g < 0)  # NaN (not ok) compares False


def to_a_batch(config: CurriculumConfig, m: int, pool: dict[str, PromptRecord], chosen: list[str], arm: str,
               fraction: float, batch: int) -> tuple[list[str], Optional[dict]]:
    """``chosen``, filled with a uniform draw from the rest of the pool to ``batch`` prompts where it holds fewer
    (a small pool at the fraction, or a selector with few candidates: the trainers refuse a subset smaller than
    their batch), and what was filled (None: nothing)."""
    if len(chosen) >= batch:
        return chosen, None
    out = filled(chosen, list(pool), None, fill_stream(config, m, arm, fraction), at_least=batch)
    k = len(out) - len(chosen)
    return out, {"filled": k, "warning": {
        "code": FILLED_TO_BATCH, "selected": len(chosen), "batch": batch, "filled": k,
        "message": f"{arm} selected {len(chosen)} prompts at stage {m}, fewer than the trainer's batch of {batch}: "
                   f"{k} more drawn uniformly from the rest of the pool so that a step takes a batch of distinct "
                   "prompts. A larger select_fraction (or a smaller batch_prompts) gives the selector the batch"}}


def select_ids(config: CurriculumConfig, paths: CurriculumPaths, m: int, pool: dict[str, PromptRecord], model: str,
               selector: str, fraction: float, scored: Optional[dict] = None) -> list[str]:
    """The prompts ``selector`` picks at ``fraction`` at stage ``m`` (``model`` is theta_m): a checked stage's
    other arm or a widened subset. Steps 1 and 2 as the stage ran them, with that selector and fraction: the
    gradients and trajectories already stored are reused, only the ranking's selection is made again.
    ``scored``: the stage's step-1 record; where it names the checkpoint it scored at ``model`` and the
    refresh split its ranking read, a ranking selector re-ranks from the store directly (``reselect``);
    a record from before ``replaced_by`` was kept scores again, which selects the same, as does a store that
    has lost what the record names (scoring computes it again)."""
    other = config.model_copy(update={"selector": selector, "select_fraction": fraction, "selector_options": {}})
    if other.ranks and scored and "replaced_by" in scored and scored.get("model") == model:
        request = other.score_request(model, scored["behavior"])
        try:
            return reselect(request, root=paths.root, name=scored["checkpoint"], replace=scored["replaced_by"])
        except NotFoundError:
            pass
    scored = score(other, paths, m, model, lambda *a: None, write=False)
    if scored.chosen is not None:
        return scored.chosen
    validation = [r for path in config.validation.values() for r in load_prompts(path)]
    return select(selector, _inputs(other, m, records=pool, validation=validation)).chosen


def train(config: CurriculumConfig, paths: CurriculumPaths, m: int, model: str, subset: str, trainer) -> dict:
    out = paths.stage(m) / "train"
    if out.exists():  # a run killed mid-stage: train the stage again from its start
        shutil.rmtree(out)
    result = trainer.train_stage(model=model, subset=subset, out_dir=str(out), steps=config.steps_per_stage,
                                 seed=stage_seed(config.seed, m), stage=m, reward=config.reward)
    batch = config.trainer_options.get("batch_prompts")
    n = len(load_prompts(subset))
    passes = {"passes": result.steps_done * batch / n} if batch and n else {}  # saturation: draws over its size
    return {**passes, "checkpoint": result.checkpoint, "fingerprint": model_fingerprint(result.checkpoint),
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


def _inputs(config: CurriculumConfig, m: int, **known) -> SelectionInputs:
    """What a selector may know at stage ``m`` beyond the ranking: the stage index salts its draws."""
    ids = [r.prompt_id for r in load_prompts(config.pool)]
    return SelectionInputs(prompt_ids=ids, fraction=config.select_fraction, seed=config.seed, salt=str(m), **known)


def _pass_rates(trajectories: str) -> dict[str, float]:
    store = TrajectoryStore.open(trajectories)
    return pass_rates((t.prompt_id, t.rewards) for t in store.iter_prompts())


def _pass_rate_table(rates: dict[str, float]) -> pa.Table:
    ids = sorted(rates)
    return pa.table({"prompt_id": ids, "pass_rate": [rates[p] for p in ids],
                     "score": [pass_rate_score(rates[p]) for p in ids]})


def _write_table(path: Path, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    fs, p = resolve(str(path))
    atomic_write_bytes(fs, p, sink.getvalue().to_pybytes())


def _finite(metrics: dict) -> dict:
    """Metrics with NaN / inf as None: state.json is strict JSON."""
    return {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}
