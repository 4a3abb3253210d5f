"""The shared vocabulary of cropi's data contracts, spelled once.

The lowest layer: imports nothing of cropi, so every layer (store, scoring,
pipeline, the service) can use it. Collection defaults live with the options
models that own them (cropi/generation/options.py).
"""

from __future__ import annotations

import re
from typing import Literal, get_args

POOL = "pool"  # the split name of the prompt pool being ranked; validation sets take any other name
SCORE_PREFIX = "score:"  # ranking column per validation set: ``score:<set name>``
SELECTED = "selected"  # ranking column: in the selected top fraction
RANKING_META_KEY = b"cropi.ranking"  # Parquet schema-metadata key of a stored ranking's meta

# Names that become file or directory names (splits, checkpoints, curricula): letters, digits,
# '_', '.', '-', not starting with '.' or '-' (so never '.', '..' or an option-like name).
NAME_MAX = 128
NAME_PATTERN = rf"^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}$"
NAME_HELP = f"1-{NAME_MAX} letters, digits, '_', '.' or '-', not starting with '.' or '-'"

# One projected-gradient row: the vector plus these metadata columns.
GRADIENT_STATUSES = ("ok", "zero_advantage", "nonfinite", "truncated")
GRADIENT_META_COLUMNS = ("raw_norm", "n_responses", "reward_mean", "reward_std", "n_tokens", "status")
# Nullable; absent from splits written before they existed (read back as NaN / None).
GRADIENT_OPTIONAL_COLUMNS = ("ess", "ess_fraction")
VectorDtype = Literal["float16", "float32"]
VECTOR_DTYPES = get_args(VectorDtype)

Backend = Literal["vllm", "hf"]  # generation engines
BACKENDS = get_args(Backend)
Fusion = Literal["rrf", "max"]  # how validation sets' ranks are fused into one
FUSIONS = get_args(Fusion)


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid split / checkpoint / curriculum name."""
    return isinstance(value, str) and re.fullmatch(NAME_PATTERN, value) is not None


def score_column(validation_set: str) -> str:
    return f"{SCORE_PREFIX}{validation_set}"
