"""SQLite connections for the service state: WAL mode, so the server and its workers share one file."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

BUSY_TIMEOUT_S = 30.0


def init(path: Path, schema: str) -> None:
    """Create the file (WAL mode: it persists in the file, so later connections need not set it) and tables."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with session(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(schema)


def add_column(path: Path, table: str, column: str, decl: str) -> None:
    """Add ``column`` to a table made by an earlier version of the service, if it lacks it."""
    with session(path) as conn:
        have = {r["name"] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def connect(path: Path) -> sqlite3.Connection:
    """A new autocommit connection (use ``session``, which keeps one per thread)."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA synchronous=NORMAL")  # with WAL: a power loss may undo the last commits, a crash cannot
    return conn


_local = threading.local()


@contextmanager
def session(path: Path) -> Iterator[sqlite3.Connection]:
    """This thread's connection to ``path``, opened on first use and kept.

    Opening a connection and reading the schema costs about a millisecond; a kept one
    answers a lookup in microseconds. Connections never cross threads (or processes:
    workers are started with exec, not fork).
    """
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    key = str(path)
    conn = conns.get(key)
    if conn is None:
        conn = conns[key] = connect(Path(path))
    yield conn


@contextmanager
def write_transaction(path: Path) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: read-then-write steps that no other writer may interleave."""
    with session(path) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
