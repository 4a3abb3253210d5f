"""One writer id, one process at a time: an exclusive lease on a dataset's writer id.

A writer, when it opens, clears its own id's leftovers (temporary files, shards no commit lists): the
remains of a killed run, which is what makes a killed job resumable. That is only safe when no other
process writes under the same id at that moment. Two curricula that reach a checkpoint of the same
content (two methods identical up to a stage) score it into one content-keyed store at once, both as
writer ``shard-0000-of-0001``: without a lease the second's clean-up deleted the first's temporary
commit file mid-rename (seen in issue 32's round 10). With it the second waits, then finds the first's
prompts committed and skips them.

On a local filesystem the lease is an ``flock`` on ``<dataset>/locks/<writer id>.lock``: the kernel
releases it when its process dies, so a killed holder never blocks a resumed run. Other pyarrow
filesystems (object stores) offer no lock: there, as before, a writer id must be written by one process
at a time (the Ray launcher gives each worker a shard of its own, hence an id of its own). A child forked
while a lease is held shares its lock until the child exits (the descriptor is closed on exec, not on fork):
collect starts its engine before it opens its writer.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

import pyarrow.fs as pafs

from cropi.errors import InvalidInputError

log = logging.getLogger(__name__)

LOCKS = "locks"  # beside commits/ and shards/; readers never look in it
# Leases this process holds: flock is per open file, so a second lease on one id in this process would wait for
# the first forever (nothing else in the process is going to release it); it is refused instead.
_HELD: set[str] = set()
_HELD_LOCK = threading.Lock()


class WriterLease:
    """Held from construction until ``release`` (or the process's end)."""

    def __init__(self, fs: pafs.FileSystem, base: str, writer_id: str, poll_s: float = 0.2):
        self._fd: int | None = None
        if not isinstance(fs, pafs.LocalFileSystem):
            return
        folder = f"{base}/{LOCKS}"
        fs.create_dir(folder, recursive=True)
        path = os.path.realpath(f"{folder}/{writer_id}.lock")
        with _HELD_LOCK:
            if path in _HELD:
                raise InvalidInputError(f"writer {writer_id!r} of {base} is already open in this process: close it "
                                        "before opening it again")
            _HELD.add(path)
        try:
            self._fd = self._acquire(path, base, writer_id, poll_s)
        except BaseException:
            with _HELD_LOCK:
                _HELD.discard(path)
            raise
        self._path = path

    @staticmethod
    def _acquire(path: str, base: str, writer_id: str, poll_s: float) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    log.info("waiting for another process writing %s as %s", base, writer_id)
                    waited = True
                time.sleep(poll_s)
            except BaseException:
                os.close(fd)
                raise
        return fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor drops the flock
            with _HELD_LOCK:
                _HELD.discard(self._path)

    def __del__(self) -> None:
        self.release()
