"""What callers registered: datasets, checkpoints and curricula (SQLite, beside the job table)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.db import add_column, init, session, write_transaction
from ..base.errors import DuplicateNameError, UnknownIdError
from cropi.errors import ConflictError
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


def _checkpoint_row(row: sqlite3.Row) -> CheckpointRow:
    d: dict[str, Any] = dict(row)
    d.pop("removed", None)
    d["validation"] = json.loads(d["validation"])
    return CheckpointRow(**d)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


class Registry:
    """Datasets, checkpoints and curricula in the SQLite file ``db_path``."""

    def __init__(self, db_path: Path):
        self.db_path = Path(db_path)
        init(self.db_path, SCHEMA)
        add_column(self.db_path, "checkpoints", "inputs", "TEXT")
        # a removed checkpoint keeps its row, marked: its name, spec and inputs still refuse a scoring
        # that would replace what the store holds for it (nothing stored is lost by a removal)
        add_column(self.db_path, "checkpoints", "removed", "REAL")
        # rows are never changed once written (a removal drops its row from here): read each once
        self._cache: dict[tuple[str, str], Any] = {}

    def count(self, table: str) -> int:
        """Registrations held in ``table`` (datasets, checkpoints), removed ones not counted."""
        where = " WHERE removed IS NULL" if table == "checkpoints" else ""
        with session(self.db_path) as conn:
            return conn.execute(f"SELECT COUNT(*) FROM {table}{where}").fetchone()[0]

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

    def datasets(self, offset: int = 0, limit: int = -1) -> tuple[list[DatasetRow], int]:
        """Datasets ``offset .. offset+limit`` oldest first (-1: all), and how many there are."""
        with session(self.db_path) as conn:
            rows = conn.execute("SELECT * FROM datasets ORDER BY created, id LIMIT ? OFFSET ?",
                                (limit, offset)).fetchall()
            total = conn.execute("SELECT COUNT(*) FROM datasets").fetchone()[0]
        return [DatasetRow(**dict(r)) for r in rows], total

    def remove_dataset(self, dataset_id: str) -> DatasetRow:
        """Forget a dataset; refused while a checkpoint still registered names it."""
        row = self.dataset(dataset_id)
        with write_transaction(self.db_path) as conn:
            users = [r["id"] for r in conn.execute(
                "SELECT id FROM checkpoints WHERE removed IS NULL AND (pool = ? OR validation LIKE ?) "
                "ORDER BY created LIMIT 6", (dataset_id, f'%"{dataset_id}"%'))]
            if users:
                raise ConflictError(f"dataset {dataset_id} is read by registered checkpoint(s) {users[:5]}"
                                    + (" and more" if len(users) > 5 else "")
                                    + ": remove them first with DELETE /v1/checkpoints/{id}")
            conn.execute("DELETE FROM datasets WHERE id = ?", (dataset_id,))
        self._cache.pop(("dataset", dataset_id), None)
        return row

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
            row = conn.execute("SELECT * FROM checkpoints WHERE name = ? AND spec_id IS ? AND "
                               "(inputs IS NULL OR inputs != ?) ORDER BY created LIMIT 1",
                               (name, spec_id, inputs)).fetchone()
        return _checkpoint_row(row) if row else None  # removed ones too: what they scored is still stored

    def checkpoint(self, checkpoint_id: str, peek: bool = False) -> CheckpointRow:
        if (row := self._cached("checkpoint", checkpoint_id, peek)) is not None:
            return row
        with session(self.db_path) as conn:
            row = conn.execute("SELECT * FROM checkpoints WHERE id = ? AND removed IS NULL",
                               (checkpoint_id,)).fetchone()
        if row is None:
            raise UnknownIdError(f"no checkpoint {checkpoint_id!r}: its id comes from POST /v1/checkpoints "
                                 "(GET /v1/checkpoints lists them)")
        return self._cache.setdefault(("checkpoint", checkpoint_id), _checkpoint_row(row))

    def checkpoints(self, offset: int = 0, limit: int = -1) -> tuple[list[CheckpointRow], int]:
        """Registered checkpoints ``offset .. offset+limit`` oldest first (-1: all), and how many there are."""
        with session(self.db_path) as conn:
            rows = conn.execute("SELECT * FROM checkpoints WHERE removed IS NULL ORDER BY created, id "
                                "LIMIT ? OFFSET ?", (limit, offset)).fetchall()
            total = conn.execute("SELECT COUNT(*) FROM checkpoints WHERE removed IS NULL").fetchone()[0]
        return [_checkpoint_row(r) for r in rows], total

    def remove_checkpoint(self, checkpoint_id: str) -> None:
        """Mark a checkpoint removed: it is no longer served, listed or counted."""
        with session(self.db_path) as conn:
            conn.execute("UPDATE checkpoints SET removed = ? WHERE id = ? AND removed IS NULL",
                         (time.time(), checkpoint_id))
        self._cache.pop(("checkpoint", checkpoint_id), None)

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
