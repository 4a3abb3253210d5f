"""The curriculum job: score, select, train, repeat, one stage at a time, resumable.

Read in this order: ``config`` (the closed schema and its resume key), ``state``
(files under ``<root>/curricula/<name>/`` and ``state.json``), ``steps`` (score,
select and train one stage), ``loop`` (the stages, resuming).

Each stage ``m`` takes ``theta_m`` (the initial model at stage 0) through three steps,
each recorded in ``state.json`` once finished. Offline trajectories come from the
behavior policy: the initial model, collected once and reused at every stage (CROPI),
or the current checkpoint when ``recollect_each_stage`` is set; they, the gradients
and the rankings are the score step's (``cropi.pipeline.score``), shared by every
curriculum under one root that can share them.

Layout of one curriculum::

    <root>/curricula/<name>/state.json            progress, written atomically after every step
    <root>/curricula/<name>/stage-<m>/subset.parquet   the stage subset (verl RLVR parquet)
                                     ranking.parquet  pass rates (pass_rate method only)
                                     metrics.json     selection and training summary
                                     train/           the trainer's folder (checkpoint/, logs)

Rerunning with more ``stages`` extends a finished curriculum; any other change of the
config is refused.
"""

from cropi.generation import CollectOptions
from cropi.pipeline.curriculum.config import MAX_STAGES, METHODS, CurriculumConfig, CurriculumConfigError
from cropi.pipeline.curriculum.state import (STATE_VERSION, CurriculumConflictError, CurriculumPaths, StageState,
                                             load_state, summary)
from cropi.utils.lazy import lazy_exports

# the steps import torch: imported on first use, so the config and state read without it (the service's HTTP side)
_TORCH_PARTS = {
    "collect_jobs": "cropi.pipeline.curriculum.jobs",
    "collect_trajectories": "cropi.pipeline.curriculum.jobs",
    "gradient_jobs": "cropi.pipeline.curriculum.jobs",
    "scoring_splits": "cropi.pipeline.curriculum.jobs",
    "run_curriculum": "cropi.pipeline.curriculum.loop",
    "stage_seed": "cropi.pipeline.curriculum.steps",
}
__getattr__ = lazy_exports(__name__, _TORCH_PARTS)
__all__ = ["MAX_STAGES", "METHODS", "STATE_VERSION", "CollectOptions", "CurriculumConfig", "CurriculumConfigError",
           "CurriculumConflictError", "CurriculumPaths", "StageState", "load_state", "summary", *_TORCH_PARTS]
