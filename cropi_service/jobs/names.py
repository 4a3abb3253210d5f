"""One live runner per name on a root: a lock file held for the runner's life.

Jobs are owned by a runner name; a runner that starts requeues the jobs its name left
running (its previous process died) and a stopping one hands its own back. Two live
runners with one name would requeue and take over each other's jobs, so the second is
refused, naming the process that holds the name. The lock is the operating system's
(``flock``): it goes with the process however that ends, so a killed runner's name is
free again at once.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..base.errors import ServiceConfigError


class RunnerName:
    """The held name; ``release()`` frees it (so does the process ending)."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    @classmethod
    def hold(cls, state_dir: Path, name: str) -> "RunnerName":
        folder = Path(state_dir) / "runners"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ServiceConfigError(
                f"a live runner already holds the name {name!r} on this root ({holder}; lock {path}): "
                "two runners with one name would requeue each other's jobs. Stop it, or start this one under "
                "another name (CROPI_SERVICE_RUNNER_NAME=...; `cropi worker --name ...`), or with --workers 0 "
                "to serve without running jobs"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
