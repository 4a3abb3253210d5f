"""The score step's jobs for a curriculum's config, for callers that run them on their
own workers (the demo spreads collect and gradient shards over processes)."""

from __future__ import annotations

from pathlib import Path

from cropi.contracts import POOL
from cropi.pipeline import score
from cropi.pipeline.collect import CollectJob
from cropi.pipeline.curriculum.config import CurriculumConfig
from cropi.pipeline.curriculum.state import CurriculumPaths
from cropi.pipeline.compute_gradients import GradientJob
from cropi.pipeline.progress import Progress


def scoring_splits(config: CurriculumConfig) -> dict[str, tuple[str, int]]:
    """The prompt sets the method scores, with their K: the pool, and for CROPI the validation sets."""
    request = config.score_request(config.model, config.model)
    k = {POOL: config.collect.pool_samples}
    return {s: (p, k.get(s, config.collect.validation_samples)) for s, p in request.splits.items()}


def collect_jobs(config: CurriculumConfig, paths: CurriculumPaths, behavior: str,
                 splits: dict[str, tuple[str, int]]) -> dict[str, CollectJob]:
    """The score step's collect job of each split, for trajectories of ``behavior``."""
    request = config.score_request(behavior, behavior)
    return score.collect_jobs(request, paths.root, {s: p for s, (p, _) in splits.items()})


def collect_trajectories(config: CurriculumConfig, paths: CurriculumPaths, behavior: str,
                         splits: dict[str, tuple[str, int]], progress: Progress) -> dict[str, str]:
    """Collect (or reuse) ``behavior``'s trajectories of the method's splits, one engine for all."""
    return score.ensure_trajectories(config.score_request(behavior, behavior), paths.root, progress)


def gradient_jobs(config: CurriculumConfig, paths: CurriculumPaths, model: str,
                  trajectories: dict[str, str]) -> list[GradientJob]:
    """The score step's gradients job of every split at ``model``, under its derived name."""
    return score.gradient_jobs(config.score_request(model, model), paths.root, trajectories)
