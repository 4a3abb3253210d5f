"""The job table: one SQLite row per job, shared by the server, its runners and their workers.

States: ``queued -> running -> succeeded | failed | cancelled``; a running job whose runner
died goes back to ``queued`` and is run again (the job functions are resumable).

Every start of a job increments ``attempts`` (the fence below). ``failures`` counts only the
attempts whose worker died on its own (crash, OOM kill): a runner that stops or dies (a server
restart) hands its jobs back without counting against them, so a progressing job survives any
number of restarts, and a job that keeps killing its worker fails after ``max_attempts`` deaths.

A worker writes progress and its final state
only while the row is still ``running`` with the attempt it was started for, so a stale worker
from an earlier attempt, or one racing a cancel, can never overwrite newer state.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.db import add_column, init, session, write_transaction
from ..base.errors import BusyError, JobFinishedError, JobRunningError, UnknownIdError

log = logging.getLogger(__name__)

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
ACTIVE = ("queued", "running")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    params TEXT NOT NULL,
    key TEXT,
    state TEXT NOT NULL,
    progress TEXT,
    result TEXT,
    error TEXT,
    owner TEXT,
    pid INTEGER,
    heartbeat REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, created);
-- at most one active job per key (for example one scoring of a checkpoint name + spec)
CREATE UNIQUE INDEX IF NOT EXISTS jobs_active_key ON jobs(key)
    WHERE key IS NOT NULL AND state IN ('queued', 'running');
"""


@dataclass(frozen=True)
class Job:
    """One row of the job table, JSON fields decoded."""

    id: str
    kind: str
    target: str
    params: dict[str, Any]
    key: str | None
    state: str
    progress: dict[str, Any] | None
    result: dict[str, Any] | None
    error: dict[str, str] | None
    owner: str | None
    pid: int | None
    heartbeat: float | None
    attempts: int
    created: float
    updated: float
    failures: int = 0
    caller: str | None = None  # who submitted it (a hash of their token): the queue's fairness and limits

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Job":
        d = dict(row)
        for name in ("params", "progress", "result", "error"):
            d[name] = json.loads(d[name]) if d[name] is not None else None
        return cls(**d)

    @property
    def finished(self) -> bool:
        return self.state not in ACTIVE


FAIR_NEXT = """
SELECT q.* FROM jobs q WHERE q.state = 'queued'
ORDER BY (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running' AND r.caller IS q.caller), q.created
LIMIT 1
"""


@dataclass(frozen=True)
class QueueLimits:
    """At most ``per_caller`` queued jobs per caller and ``total`` in all; past them, a 429."""

    per_caller: int
    total: int
    retry_after_s: int = 30

    def check(self, conn: sqlite3.Connection, caller: str | None) -> None:
        total = conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
        mine = conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND caller IS ?",
                            (caller,)).fetchone()[0]
        if mine >= self.per_caller:
            raise BusyError(f"you have {mine} jobs queued, the most one caller may (max_queued_per_caller): "
                            "wait for some to start (GET /v1/jobs/<id>) or cancel some, then submit again",
                            retry_after_s=self.retry_after_s)
        if total >= self.total:
            raise BusyError(f"the job queue is full ({total} queued, max_queued): submit again later",
                            retry_after_s=self.retry_after_s)


class JobStore:
    """Operations on the job table in the SQLite file ``db_path``."""

    def __init__(self, db_path: Path):
        self.db_path = Path(db_path)
        init(self.db_path, SCHEMA)
        add_column(self.db_path, "jobs", "failures", "INTEGER NOT NULL DEFAULT 0")
        add_column(self.db_path, "jobs", "caller", "TEXT")

    # creating and reading

    def create(self, kind: str, target: str, params: dict[str, Any], *, key: str | None = None,
               caller: str | None = None, limits: QueueLimits | None = None) -> Job:
        """A new queued job. With ``key``, refuses (JobRunningError) while another job with that key is active;
        with ``limits``, refuses (BusyError, a 429) when ``caller`` or everyone has that many queued already."""
        now = time.time()
        job_id = "job_" + uuid.uuid4().hex[:16]
        try:
            with write_transaction(self.db_path) as conn:  # counted and inserted in one transaction
                if limits is not None:
                    limits.check(conn, caller)
                conn.execute(
                    "INSERT INTO jobs (id, kind, target, params, key, state, created, updated, caller) "
                    "VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, ?)",
                    (job_id, kind, target, json.dumps(params), key, now, now, caller))
        except sqlite3.IntegrityError as e:
            active = self.active_with_key(key)
            raise JobRunningError(
                f"{kind} job {active.id if active else '?'} for the same {key!r} is still "
                f"{active.state if active else 'active'}: wait for it (GET /v1/jobs/{active.id if active else '...'}) "
                "or cancel it (DELETE) first") from e
        return self.get(job_id)

    def get(self, job_id: str) -> Job:
        with session(self.db_path) as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownIdError(f"no job {job_id!r}: job ids come from POST /v1/checkpoints or /v1/curricula")
        return Job.from_row(row)

    def active_with_key(self, key: str | None) -> Job | None:
        with session(self.db_path) as conn:
            row = conn.execute("SELECT * FROM jobs WHERE key = ? AND state IN ('queued', 'running')",
                               (key,)).fetchone()
        return Job.from_row(row) if row else None

    def latest_succeeded(self, key: str) -> Job | None:
        """The most recently finished successful job with ``key``."""
        with session(self.db_path) as conn:
            row = conn.execute("SELECT * FROM jobs WHERE key = ? AND state = 'succeeded' "
                               "ORDER BY updated DESC LIMIT 1", (key,)).fetchone()
        return Job.from_row(row) if row else None

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state (every state present, zero when none)."""
        with session(self.db_path) as conn:
            rows = conn.execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state").fetchall()
        counts = dict.fromkeys(STATES, 0)
        counts.update({r["state"]: r["n"] for r in rows})
        return counts

    def prompts_scored(self) -> int:
        """Sum of ``result.prompts_scored`` over succeeded jobs (monotonic: jobs are never deleted)."""
        with session(self.db_path) as conn:
            row = conn.execute("SELECT COALESCE(SUM(json_extract(result, '$.prompts_scored')), 0) "
                               "FROM jobs WHERE state = 'succeeded'").fetchone()
        return int(row[0])

    # the runner's side

    def claim(self, owner: str, max_attempts: int) -> Job | None:
        """Move a queued job to ``running`` for ``owner``; None when the queue is empty.

        Fair across callers: the oldest job of the caller with the fewest jobs running now, so one
        caller's hundred queued jobs do not hold back another caller's one.

        A job whose worker died ``max_attempts`` times is marked failed instead of started again,
        so a job that keeps killing its worker cannot loop forever.
        """
        while True:
            with write_transaction(self.db_path) as conn:
                row = conn.execute(FAIR_NEXT).fetchone()
                if row is None:
                    return None
                now = time.time()
                if row["failures"] >= max_attempts:
                    last = json.loads(row["error"])["message"] if row["error"] else "no record"
                    err = {"code": "worker_died",
                           "message": f"the job's worker died {row['failures']} times without finishing "
                                      f"(the service's max_attempts); see its worker log under "
                                      f"<root>/service/logs and submit it again. The last: {last}"}
                    log.error("job failed: its worker died too often",
                              extra={"job": row["id"], "failures": row["failures"]})
                    conn.execute("UPDATE jobs SET state = 'failed', error = ?, updated = ? WHERE id = ?",
                                 (json.dumps(err), now, row["id"]))
                    continue
                # error is kept: while a retried job runs, it says why the previous attempt died
                conn.execute("UPDATE jobs SET state = 'running', owner = ?, pid = NULL, heartbeat = ?, "
                             "attempts = attempts + 1, updated = ? WHERE id = ?",
                             (owner, now, now, row["id"]))
            return self.get(row["id"])

    def set_pid(self, job_id: str, attempt: int, pid: int | None) -> None:
        with session(self.db_path) as conn:
            conn.execute("UPDATE jobs SET pid = ? WHERE id = ? AND attempts = ?", (pid, job_id, attempt))

    def beat(self, owner: str) -> None:
        """Mark every running job of ``owner`` as alive now."""
        with session(self.db_path) as conn:
            conn.execute("UPDATE jobs SET heartbeat = ? WHERE owner = ? AND state = 'running'",
                         (time.time(), owner))

    def requeue_owned(self, owner: str) -> list[str]:
        """Put ``owner``'s running jobs back in the queue (its previous process died). Returns their ids."""
        return self._requeue("owner = ?", (owner,))

    def requeue_stale(self, stale_after_s: float) -> list[str]:
        """Requeue running jobs whose runner has not beaten for ``stale_after_s`` seconds."""
        return self._requeue("heartbeat < ?", (time.time() - stale_after_s,))

    def requeue_died(self, job_id: str, attempt: int, error: dict[str, str]) -> bool:
        """Attempt ``attempt``'s worker died alone: count it and queue the job again (the job
        functions resume). False when the attempt no longer owns the job."""
        with session(self.db_path) as conn:
            cur = conn.execute(
                "UPDATE jobs SET state = 'queued', owner = NULL, pid = NULL, failures = failures + 1, error = ?, "
                "updated = ? WHERE id = ? AND attempts = ? AND state = 'running'",
                (json.dumps(error), time.time(), job_id, attempt))
        return cur.rowcount == 1

    def _requeue(self, where: str, args: tuple) -> list[str]:
        with write_transaction(self.db_path) as conn:
            ids = [r["id"] for r in conn.execute(f"SELECT id FROM jobs WHERE state = 'running' AND {where}", args)]
            conn.executemany("UPDATE jobs SET state = 'queued', owner = NULL, pid = NULL, updated = ? WHERE id = ?",
                             [(time.time(), i) for i in ids])
        return ids

    # the worker's side (fenced by attempt)

    def report(self, job_id: str, attempt: int, stage: str, done: int, total: int) -> bool:
        """Record progress; False when this attempt no longer owns the job (cancelled, requeued)."""
        progress = json.dumps({"stage": stage, "done": int(done), "total": int(total)})
        with session(self.db_path) as conn:
            cur = conn.execute("UPDATE jobs SET progress = ?, updated = ? WHERE id = ? AND attempts = ? "
                               "AND state = 'running'", (progress, time.time(), job_id, attempt))
        return cur.rowcount == 1

    def finish(self, job_id: str, attempt: int, state: str, *, result: dict | None = None,
               error: dict | None = None) -> bool:
        """Final state of this attempt; False (nothing written) when the attempt no longer owns the job."""
        if state not in ("succeeded", "failed"):
            raise ValueError(f"a worker finishes a job as succeeded or failed, not {state!r}")
        with session(self.db_path) as conn:
            cur = conn.execute(
                "UPDATE jobs SET state = ?, result = ?, error = ?, pid = NULL, updated = ? "
                "WHERE id = ? AND attempts = ? AND state = 'running'",
                (state, json.dumps(result) if result is not None else None,
                 json.dumps(error) if error is not None else None, time.time(), job_id, attempt))
        return cur.rowcount == 1

    # the caller's side

    def cancel(self, job_id: str) -> Job:
        """Mark a queued or running job cancelled; its runner stops the worker on its next tick."""
        with session(self.db_path) as conn:
            cur = conn.execute("UPDATE jobs SET state = 'cancelled', updated = ? WHERE id = ? "
                               "AND state IN ('queued', 'running')", (time.time(), job_id))
        job = self.get(job_id)
        if cur.rowcount == 0 and job.state != "cancelled":
            raise JobFinishedError(f"job {job_id} already {job.state}; there is nothing to cancel")
        return job
