"""What a caller asks the service to do: the bodies of the POSTs that register data and start jobs.

Options come from ``caller`` (derived from the library's models); names follow the library's rule.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from cropi.contracts import NAME_HELP, NAME_MAX, NAME_PATTERN
from cropi.pipeline.curriculum.config import CurriculumConfig

from .caller import CurriculumOptions, Fraction, Projection, ScoringOptions, Stages
from .derive import library_default

ID_MAX = 64  # the ids the service hands out (ds_..., ck_..., job ids) are shorter
MAX_PATH = 4096  # PATH_MAX on Linux
# Dataset and checkpoint names become split names, column names and path components in the store.
Name = Field(pattern=NAME_PATTERN, description=NAME_HELP)
Path_ = Field(min_length=1, max_length=MAX_PATH)
Id = Annotated[str, Field(max_length=ID_MAX)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, max_length=MAX_PATH,
                      description="prompt file (jsonl, parquet or verl parquet) under a data root")
    kind: Literal["pool", "validation"]


class CheckpointCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, max_length=MAX_PATH,
                      description="model folder (Hugging Face layout) under a data root")
    pool: str = Field(max_length=ID_MAX, description="id of a dataset registered with kind=pool")
    validation: list[Id] = Field(min_length=1, max_length=16, description="ids of validation datasets")
    trajectories: Optional[dict[Annotated[str, Field(max_length=NAME_MAX)], Annotated[str, Path_]]] = Field(
        default=None, max_length=17,
        description="split name (pool dataset name or validation dataset name) -> trajectory "
                    "directory under a data root; omitted splits are collected")
    projection: Optional[Projection] = Field(default=None, description="projection spec; default spec if omitted")
    options: Optional[ScoringOptions] = Field(default=None, description="collection, loss and ranking options")


class CurriculumCreate(Strict):
    name: str = Name
    path: str = Field(min_length=1, max_length=MAX_PATH, description="initial model folder under a data root")
    pool: str = Field(max_length=ID_MAX, description="id of a pool dataset")
    validation: list[Id] = Field(min_length=1, max_length=16)
    stages: Stages = library_default(CurriculumConfig, "stages")
    fraction: Fraction = library_default(CurriculumConfig, "select_fraction")
    projection: Optional[Projection] = None
    options: Optional[CurriculumOptions] = Field(default=None, description="method, trainer and collection options")
