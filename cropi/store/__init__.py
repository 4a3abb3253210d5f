"""Sharded Arrow/Parquet stores with manifests: trajectories and projected gradients."""

from cropi.store.gradient_table import GradientTable
from cropi.store.gradient_writer import GradientWriter
from cropi.store.gradient_store import GradientSplit, GradientStore, SplitReader
from cropi.store.key_index import KeyIndex
from cropi.store.part_cache import PartCache
from cropi.store.sharded import ShardedDataset, ShardWriter
from cropi.store.trajectories import TRAJECTORY_SCHEMA, PromptTrajectories, TrajectoryStore, TrajectoryWriter
from cropi.store.types import GRADIENT_STATUSES, CheckpointRef, GradientRecord, gradient_schema

__all__ = [
    "GRADIENT_STATUSES", "TRAJECTORY_SCHEMA", "CheckpointRef", "GradientRecord", "GradientSplit", "GradientStore",
    "GradientTable", "GradientWriter", "KeyIndex", "PartCache", "PromptTrajectories", "ShardWriter", "ShardedDataset", "SplitReader",
    "TrajectoryStore", "TrajectoryWriter", "gradient_schema",
]
