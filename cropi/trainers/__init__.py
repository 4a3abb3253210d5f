"""Trainer adapters: train one CROPI stage on its subset, return the next checkpoint.

``make_trainer("trl")`` is the embedded default (trl's GRPOTrainer, in-process, CPU
or one GPU); ``make_trainer("verl")`` launches verl GRPO runs on GPUs. The
adapters themselves are imported on first use, so this package imports in an
environment that has only one of trl and verl.
"""

from cropi.trainers.base import (GrpoOptions, StageResult, TrainerAdapter, TrainerOptionsError,
                                 TrainingFailedError, UnknownTrainerError, available_trainers, make_trainer,
                                 trainer_class)
from cropi.trainers.lineage import StageMarker, read_marker, reference_model

__all__ = ["GrpoOptions", "StageResult", "TrainerAdapter", "TrainerOptionsError", "TrainingFailedError",
           "UnknownTrainerError", "available_trainers", "make_trainer", "trainer_class", "StageMarker",
           "read_marker", "reference_model"]
