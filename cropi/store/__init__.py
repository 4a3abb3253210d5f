"""Sharded Arrow/Parquet stores with manifests: trajectories and projected gradients."""

from cropi.store.gradient_table import GradientTable
from cropi.store.gradients import (GRADIENT_STATUSES, CheckpointRef, GradientSplit, GradientStore,
                                   GradientWriter, gradient_schema)
from cropi.store.sharded import ShardedDataset, ShardWriter
from cropi.store.trajectories import TRAJECTORY_SCHEMA, PromptTrajectories, TrajectoryStore, TrajectoryWriter

__all__ = [
    "GRADIENT_STATUSES", "TRAJECTORY_SCHEMA", "CheckpointRef", "GradientSplit", "GradientStore",
    "GradientTable", "GradientWriter", "PromptTrajectories", "ShardWriter", "ShardedDataset",
    "TrajectoryStore", "TrajectoryWriter", "gradient_schema",
]
