"""The curriculum job: score, select, train, repeat, one stage at a time, resumable.

A rerun resumes at stage granularity: finished steps are not redone, a stage whose
training was interrupted is trained again from its start, and a stage scored but not
yet selected is scored again (its gradients are stored, so that is only the ranking)
so the selection comes from the ranking just computed, never from a file read back.
"""

from __future__ import annotations

import time
from pathlib import Path

from cropi.data import PromptRecord, load_prompts
from cropi.errors import InvalidInputError
from cropi.pipeline.curriculum import parts, steps
from cropi.pipeline.curriculum.config import CurriculumConfig
from cropi.pipeline.curriculum.state import CurriculumConflictError, CurriculumPaths, StageState, summary
from cropi.pipeline.progress import Progress, report
from cropi.trainers import make_trainer
from cropi.utils.fingerprint import model_fingerprint


def run_curriculum(config: CurriculumConfig, *, root: str | Path, progress: Progress | None = None) -> dict:
    """Run (or resume) the curriculum under ``root``; returns its stages (see ``summary``)."""
    progress = report(progress)
    trainer = make_trainer(config.trainer, **config.trainer_options)  # bad options fail before any work
    pool = {r.prompt_id: r for r in load_prompts(config.pool)}
    batch = steps.batch_of(trainer)
    if len(pool) < batch:
        raise InvalidInputError(f"the pool {config.pool} has {len(pool)} prompts, fewer than one step's batch of "
                                f"the trainer ({batch} distinct prompts): lower the trainer's batch_prompts to at "
                                f"most {len(pool)}, or use a larger pool")
    paths = CurriculumPaths(root, config.name)
    state = StageState.open(paths, config)
    _pin_initial_model(state, config)
    state.doc["finished"] = False
    state.save()
    for m in range(config.stages):
        progress(f"curriculum {config.name}", m, config.stages)
        if "trained" not in state.stage(m):
            _run_stage(config, paths, state, m, pool, trainer, _stage_progress(progress, config.name, m))
        # again on a resume: a kill may have come between the save and the release
        _release(trainer, state, m, config.stages)
    progress(f"curriculum {config.name}", config.stages, config.stages)
    state.doc["finished"] = True
    state.save()
    return summary(state.doc, config.stages)


def _run_stage(config: CurriculumConfig, paths: CurriculumPaths, state: StageState, m: int,
               pool: dict[str, PromptRecord], trainer, progress: Progress) -> None:
    stage = state.stage(m)
    model = state.stage_model(m)
    if "selected" not in stage:
        started = time.monotonic()
        scored = steps.score(config, paths, m, model, progress)
        if "scored" not in stage:  # with its wall seconds: what the method's selection cost at this stage
            state.finish(m, "scored", scored.record | {"seconds": round(time.monotonic() - started, 3)})
        before = state.stage(m - 1).get("scored") if m else None
        state.finish(m, "selected", steps.select_stage(config, paths, m, pool, scored.chosen, scored.mix,
                                                       batch=steps.batch_of(trainer), scored=state.stage(m)["scored"],
                                                       before=before))
    unchecked = parts.checked(config, trainer)
    if unchecked is None:  # trained in parts, each checked (cropi.pipeline.curriculum.check)
        pick = lambda selector, fraction: steps.select_ids(config, paths, m, pool, model, selector, fraction,  # noqa: E731
                                                            state.stage(m).get("scored"))
        trained = parts.run_checked_stage(config, paths, state, m, pool, trainer, pick, progress)
    else:
        trained = steps.train(config, paths, m, model, stage["selected"]["subset"], trainer) | {
            "checked": False, "unchecked": unchecked}
    state.finish(m, "trained", trained)
    steps.write_metrics(paths, m, stage)


def _release(trainer, state: StageState, m: int, stages: int) -> None:
    """Once stage ``m`` is trained the curriculum trains on from its end, and a checked stage may restore the
    curriculum's best (``check.best_of: run``; with ``stage`` a stage restores only within itself): the trainer
    may drop the run state behind every other checkpoint the stage trained from or made, and behind the best it
    was handed if it found a better one. The initial model is the caller's and is never released."""
    stage = state.stage(m)
    made = set(parts.checkpoints(stage))
    if m:
        made |= {state.stage_model(m)} | parts.carried_best(state.stage(m - 1))
    keep = {stage["trained"]["checkpoint"], state.stage_model(0)}
    if m < stages - 1:
        keep |= parts.carried_best(stage)
    for checkpoint in sorted(made - keep):
        trainer.release(checkpoint)


def _pin_initial_model(state: StageState, config: CurriculumConfig) -> None:
    initial = {"path": str(Path(config.model).resolve()), "fingerprint": model_fingerprint(config.model)}
    if state.doc.setdefault("initial_model", initial)["fingerprint"] != initial["fingerprint"]:
        raise CurriculumConflictError(f"the initial model {config.model} changed since curriculum {config.name!r} "
                                      f"started (fingerprint {state.doc['initial_model']['fingerprint']}, now "
                                      f"{initial['fingerprint']}); restore it or start a new curriculum")


def _stage_progress(progress: Progress, name: str, m: int) -> Progress:
    return lambda what, done, total: progress(f"{name} stage {m}: {what}", done, total)
