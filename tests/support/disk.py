"""A device that fills up, for the tests of a full disk: the kernel's own behaviour (a short write, then ENOSPC)
in place of the atomic write's synced write, since a real full filesystem (a small tmpfs) needs privileges CI
machines do not give."""

from __future__ import annotations

import errno
import os

from cropi.utils import fsio

REAL_WRITE = fsio._write_local_synced


def fill_after(monkeypatch, writes: int, code: int = errno.ENOSPC) -> list[str]:
    """Let ``writes`` atomic writes through, then fail every later one as a full device does: part of
    the bytes land in the temporary file, then ``code``. Returns the paths it failed."""
    passed: list[str] = []
    failed: list[str] = []

    def write(path: str, data: bytes) -> None:
        if len(passed) < writes:
            passed.append(path)
            return REAL_WRITE(path, data)
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
        failed.append(path)
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(fsio, "_write_local_synced", write)
    return failed
