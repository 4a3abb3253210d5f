"""The job runner: claims queued jobs and runs each attempt away from the server process.

One loop (a thread in the server, or the whole process of ``python -m cropi_service worker``)
claims jobs up to its slot count, starts each attempt through a launcher (a local worker
process, or a Ray task when ``ray_address`` is set), writes heartbeats, stops attempts whose
job was cancelled, and queues again the jobs whose worker died without a word (counting the
death; a job fails after ``max_attempts`` of them). On start it puts
back in the queue the jobs its previous incarnation left running: the job functions are
resumable, so running them again continues where they stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..base.settings import ServiceSettings
from .names import RunnerName
from .table import Job, JobStore, QueueLimits
from .worker import BUILTIN_TARGET, execute_job

log = logging.getLogger(__name__)

# Built-in job kinds: the worker finds their functions in ``kinds.BUILTIN`` (imported there only:
# it imports the library's heavy parts). Other kinds (plugins, tests) name a "module:function".
DEFAULT_KINDS = {"scoring": BUILTIN_TARGET, "curriculum": BUILTIN_TARGET}
KILL_GRACE_S = 5.0
LOG_TAIL_CHARS = 2000


class Launcher(Protocol):
    """Starts, polls and stops one attempt of a job."""

    def start(self, job: Job) -> Any: ...

    def poll(self, handle: Any) -> int | None:
        """The attempt's exit code once it has ended, else None."""

    def stop(self, handle: Any, force: bool) -> None: ...

    def pid(self, handle: Any) -> int | None: ...

    def describe_exit(self, job: Job, handle: Any, code: int) -> str: ...


class ProcessLauncher:
    """Each attempt is ``python -m <this package>.worker`` in its own session (process group)."""

    def __init__(self, root: Path):
        self.root = root
        self.log_dir = root / "service" / "logs"

    def start(self, job: Job) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # the worker imports what this process can import (the same rule as multiprocessing's spawn)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
        cmd = [sys.executable, "-m", f"{__package__}.worker", "--root", str(self.root), "--job", job.id,
               "--attempt", str(job.attempts), "--parent", str(os.getpid())]
        with open(self.log_path(job), "ab") as out:
            out.write(f"--- attempt {job.attempts} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            out.flush()
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)

    def poll(self, handle: subprocess.Popen) -> int | None:
        return handle.poll()

    def stop(self, handle: subprocess.Popen, force: bool) -> None:
        try:
            os.killpg(handle.pid, signal.SIGKILL if force else signal.SIGTERM)
        except ProcessLookupError:
            pass

    def pid(self, handle: subprocess.Popen) -> int | None:
        return handle.pid

    def log_path(self, job: Job) -> Path:
        return self.log_dir / f"{job.id}.log"

    def describe_exit(self, job: Job, handle: subprocess.Popen, code: int) -> str:
        how = f"signal {-code}" if code < 0 else f"code {code}"
        try:
            tail = self.log_path(job).read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            tail = ""
        return f"the worker process exited with {how} without recording a result; log tail:\n{tail}"


class RayLauncher:
    """Each attempt is a Ray task running ``jobs.worker.execute_job`` (root must be shared storage)."""

    def __init__(self, root: Path, address: str, num_gpus: float = 0.0):
        import ray  # optional dependency, imported only when a Ray address is configured

        self.ray, self.root = ray, root
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self.task = ray.remote(num_gpus=num_gpus, max_retries=0)(_ray_execute)

    def start(self, job: Job) -> Any:
        return self.task.remote(str(self.root), job.id, job.attempts)

    def poll(self, handle: Any) -> int | None:
        ready, _ = self.ray.wait([handle], timeout=0)
        if not ready:
            return None
        try:
            return int(self.ray.get(handle))
        except Exception as e:  # the task died (worker crash, cancel)
            log.warning("ray task ended with %s", e)
            return 1

    def stop(self, handle: Any, force: bool) -> None:
        self.ray.cancel(handle, force=True)

    def pid(self, handle: Any) -> int | None:
        return None

    def describe_exit(self, job: Job, handle: Any, code: int) -> str:
        return f"the Ray task ended with code {code} without recording a result; see the Ray worker logs"


def _ray_execute(root: str, job_id: str, attempt: int) -> int:
    return execute_job(Path(root), job_id, attempt)


@dataclass
class _Attempt:
    job: Job
    handle: Any
    stop_sent_at: float | None = None


@dataclass
class Runner:
    """Claims and supervises jobs for ``settings.runner_name`` with ``settings.workers`` slots."""

    settings: ServiceSettings
    jobs: JobStore
    kinds: dict[str, str] = field(default_factory=dict)
    launcher: Launcher | None = None

    def __post_init__(self) -> None:
        self.kinds = {**DEFAULT_KINDS, **self.settings.job_kinds, **self.kinds}
        self.running: dict[str, _Attempt] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat = 0.0
        self._name: RunnerName | None = None

    def target(self, kind: str) -> str:
        """The ``module:function`` a job of ``kind`` runs."""
        try:
            return self.kinds[kind]
        except KeyError:
            raise ValueError(f"unknown job kind {kind!r}; known: {sorted(self.kinds)}") from None

    def submit(self, kind: str, params: dict[str, Any], *, key: str | None = None, caller: str | None = None) -> Job:
        """Queue a job of ``kind`` for ``caller`` (within the queue's limits) and wake the loop."""
        limits = QueueLimits(self.settings.max_queued_per_caller, self.settings.max_queued)
        job = self.jobs.create(kind, self.target(kind), params, key=key, caller=caller, limits=limits)
        self._wake.set()
        return job

    def cancel(self, job_id: str) -> Job:
        """Mark the job cancelled; the loop stops its attempt on the next tick."""
        job = self.jobs.cancel(job_id)
        self._wake.set()
        return job

    # the loop

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Requeue what this runner's previous process left running, then start the loop thread."""
        if self.launcher is None:
            self.launcher = self._default_launcher()
        # one live runner per name and root: else one would requeue (and take over) the other's jobs
        if self._name is None:  # (an app whose lifespan is entered twice starts its one runner twice)
            self._name = RunnerName.hold(self.settings.state_dir, self.settings.runner_name)
        self._stop.clear()
        resumed = self.jobs.requeue_owned(self.settings.runner_name)
        if resumed:
            log.info("resuming jobs left running by a previous process (not counted as failures)",
                     extra={"jobs": resumed})
        self._thread = threading.Thread(target=self.run_forever, name="cropi-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop, stop running attempts and put their jobs back in the queue."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        attempts = list(self.running.values())
        for attempt in attempts:
            self.launcher.stop(attempt.handle, force=True)
        deadline = time.monotonic() + KILL_GRACE_S
        while attempts and time.monotonic() < deadline:  # reap them: no zombies left behind
            attempts = [a for a in attempts if self.launcher.poll(a.handle) is None]
            time.sleep(0.02)
        self.running.clear()
        handed_back = self.jobs.requeue_owned(self.settings.runner_name)
        if handed_back:
            log.info("stopping: running jobs handed back to the queue", extra={"jobs": handed_back})
        if self._name is not None:
            self._name.release()
            self._name = None

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # keep supervising: a transient SQLite or OS error must not orphan jobs
                log.exception("runner tick failed")
            self._wake.wait(self.settings.poll_s)
            self._wake.clear()

    def tick(self) -> None:
        """One pass: reap, stop cancelled, beat, requeue stale, claim."""
        self._reap()
        self._stop_superseded()
        now = time.monotonic()
        if now - self._last_beat >= self.settings.heartbeat_s:
            self._last_beat = now
            self.jobs.beat(self.settings.runner_name)
            for job_id in self.jobs.requeue_stale(self.settings.stale_after_s):
                log.warning("requeued a job whose runner went silent", extra={"job": job_id})
        while len(self.running) < self.settings.workers and not self._stop.is_set():
            job = self.jobs.claim(self.settings.runner_name, self.settings.max_attempts)
            if job is None:
                break
            self._launch(job)

    def _launch(self, job: Job) -> None:
        try:
            handle = self.launcher.start(job)
        except Exception as e:
            log.exception("could not start job", extra={"job": job.id})
            self.jobs.finish(job.id, job.attempts, "failed",
                             error={"code": "launch_failed", "message": f"could not start a worker: {e}"})
            return
        self.running[job.id] = _Attempt(job, handle)
        self.jobs.set_pid(job.id, job.attempts, self.launcher.pid(handle))
        log.info("job started", extra={"job": job.id, "kind": job.kind, "attempt": job.attempts})

    def _reap(self) -> None:
        for job_id, attempt in list(self.running.items()):
            code = self.launcher.poll(attempt.handle)
            if code is None:
                continue
            del self.running[job_id]
            job = attempt.job
            # a worker that died without recording its end (a crash, the OOM killer) leaves the row
            # running: count the death and run the job again (it resumes); claim() fails it once
            # it has died max_attempts times
            error = {"code": "worker_died", "message": self.launcher.describe_exit(job, attempt.handle, code)}
            if self.jobs.requeue_died(job_id, job.attempts, error):
                log.warning("worker died; job queued again to resume", extra={
                    "job": job_id, "exit": code, "attempt": job.attempts, "failures": job.failures + 1,
                    "max_attempts": self.settings.max_attempts})
                self._wake.set()
            else:
                log.info("job attempt ended", extra={"job": job_id, "exit": code})

    def _stop_superseded(self) -> None:
        """Stop attempts whose job was cancelled or taken over (escalating to a hard kill)."""
        for job_id, attempt in list(self.running.items()):
            current = self.jobs.get(job_id)
            if current.state == "running" and current.attempts == attempt.job.attempts:
                continue
            now = time.monotonic()
            if attempt.stop_sent_at is None:
                attempt.stop_sent_at = now
                self.launcher.stop(attempt.handle, force=False)
                log.info("stopping job attempt", extra={"job": job_id, "state": current.state})
            elif now - attempt.stop_sent_at > KILL_GRACE_S:
                self.launcher.stop(attempt.handle, force=True)

    def _default_launcher(self) -> Launcher:
        if self.settings.ray_address:
            return RayLauncher(self.settings.root, self.settings.ray_address, self.settings.ray_num_gpus)
        return ProcessLauncher(self.settings.root)
