"""What callers registered: datasets, checkpoints and curricula (SQLite, beside the job table)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.db import add_column, init, session
from ..base.errors import DuplicateNameError, UnknownIdError
from .cache import NotLoaded

SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, path TEXT NOT NULL, kind TEXT NOT NULL,
    n_prompts INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, path TEXT NOT NULL, pool TEXT NOT NULL,
    validation TEXT NOT NULL, spec_id TEXT, job_id TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS curricula (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, job_id TEXT NOT NULL, created REAL NOT NULL);
"""


@dataclass(frozen=True)
class DatasetRow:
    id: str
    name: str
    path: str
    kind: str
    n_prompts: int
    created: float


@dataclass(frozen=True)
class CheckpointRow:
    id: str
    name: str
    path: str
    pool: str
    validation: list[str]
    spec_id: str | None
    job_id: str
    created: float
    inputs: str | None = None  # digest of everything the scoring read (paths, options): see Service


@dataclass(frozen=True)
class CurriculumRow:
    id: str
    name: str
    job_id: str
    created: float


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


class Registry:
    """Datasets, checkpoints and curricula in the SQLite file ``db_path``."""

    def __init__(self, db_path: Path):
        self.db_path = Path(db_path)
        init(self.db_path, SCHEMA)
        add_column(self.db_path, "checkpoints", "inputs", "TEXT")
        # rows are never changed or deleted once written: read each once
        self._cache: dict[tuple[str, str], Any] = {}

    # datasets

    def add_dataset(self, name: str, path: str, kind: str, n_prompts: int) -> DatasetRow:
        row = DatasetRow(new_id("ds"), name, path, kind, n_prompts, time.time())
        try:
            with session(self.db_path) as conn:
                conn.execute("INSERT INTO datasets VALUES (?, ?, ?, ?, ?, ?)",
                             (row.id, name, path, kind, n_prompts, row.created))
        except sqlite3.IntegrityError as e:
            raise DuplicateNameError(f"a dataset named {name!r} is already registered: use its id "
                                     "(GET /v1/datasets) or register under another name") from e
        return row

    def _cached(self, kind: str, row_id: str, peek: bool) -> Any:
        """A row read before, or None to read it; with ``peek`` NotLoaded instead of reading."""
        row = self._cache.get((kind, row_id))
        if row is None and peek:
            raise NotLoaded((kind, row_id))
        return row

    def dataset(self, dataset_id: str, peek: bool = False) -> DatasetRow:
        if (row := self._cached("dataset", dataset_id, peek)) is not None:
            return row
        with session(self.db_path) as conn:
            row = conn.execute("SELECT * FROM datasets WHERE id = ?", (dataset_id,)).fetchone()
        if row is None:
            raise UnknownIdError(f"no dataset {dataset_id!r}: register it with POST /v1/datasets; "
                                 "GET /v1/datasets lists the ids")
        return self._cache.setdefault(("dataset", dataset_id), DatasetRow(**dict(row)))

    def datasets(self) -> list[DatasetRow]:
        with session(self.db_path) as conn:
            rows = conn.execute("SELECT * FROM datasets ORDER BY created").fetchall()
        return [DatasetRow(**dict(r)) for r in rows]

    # checkpoints

    def add_checkpoint(self, row: CheckpointRow) -> None:
        with session(self.db_path) as conn:
            conn.execute("INSERT INTO checkpoints (id, name, path, pool, validation, spec_id, job_id, created, "
                         "inputs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (row.id, row.name, row.path, row.pool, json.dumps(row.validation),
                          row.spec_id, row.job_id, row.created, row.inputs))

    def scored_with_other_inputs(self, name: str, spec_id: str | None, inputs: str) -> CheckpointRow | None:
        """A checkpoint registered under ``name`` and ``spec_id`` whose scoring read other inputs."""
        with session(self.db_path) as conn:
            row = conn.execute("SELECT id FROM checkpoints WHERE name = ? AND spec_id IS ? AND "
                               "(inputs IS NULL OR inputs != ?) ORDER BY created LIMIT 1",
                               (name, spec_id, inputs)).fetchone()
        return self.checkpoint(row["id"]) if row else None

    def checkpoint(self, checkpoint_id: str, peek: bool = False) -> CheckpointRow:
        if (row := self._cached("checkpoint", checkpoint_id, peek)) is not None:
            return row
        with session(self.db_path) as conn:
            row = conn.execute("SELECT * FROM checkpoints WHERE id = ?", (checkpoint_id,)).fetchone()
        if row is None:
            raise UnknownIdError(f"no checkpoint {checkpoint_id!r}: its id comes from POST /v1/checkpoints")
        d: dict[str, Any] = dict(row)
        d["validation"] = json.loads(d["validation"])
        return self._cache.setdefault(("checkpoint", checkpoint_id), CheckpointRow(**d))

    # curricula

    def add_curriculum(self, row: CurriculumRow) -> None:
        with session(self.db_path) as conn:
            conn.execute("INSERT INTO curricula VALUES (?, ?, ?, ?)", (row.id, row.name, row.job_id, row.created))

    def curriculum(self, curriculum_id: str) -> CurriculumRow:
        if (row := self._cached("curriculum", curriculum_id, False)) is not None:
            return row
        with session(self.db_path) as conn:
            row = conn.execute("SELECT * FROM curricula WHERE id = ?", (curriculum_id,)).fetchone()
        if row is None:
            raise UnknownIdError(f"no curriculum {curriculum_id!r}: its id comes from POST /v1/curricula")
        return self._cache.setdefault(("curriculum", curriculum_id), CurriculumRow(**dict(row)))
