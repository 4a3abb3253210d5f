"""One writer id, one process at a time (cropi.store.lease): a second process opening a writer id another holds
waits for it, then sees everything the first committed (its leftovers clean-up touches nothing in flight),
and a killed holder frees the id at once. Real processes, a real store on disk.

The mistake this catches: without the lease the second writer opens at once, while the first still holds
uncommitted rows, and clears the first's temporary files as its own leftovers (issue 32's round 10 died of it:
two curricula scoring one checkpoint into one content-keyed store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support.store import CKPT, SPEC, grad_row, open_split, write_grads

from cropi.errors import InvalidInputError
from cropi.store import GradientStore
from cropi.store.lease import WriterLease

HERE = Path(__file__).resolve().parent

HOLDER = textwrap.dedent("""
    import time
    from pathlib import Path
    from support.store import open_split, grad_row
    split = open_split({root!r})
    with split.writer("shard-0000-of-0001", rows_per_shard=4) as w:
        for i in range(6):  # one shard of 4 committed, 2 rows buffered while it holds the id
            w.append(**grad_row(f"p{{i}}"))
        Path({marker!r}).write_text("holding")
        time.sleep({hold_s})
    Path({marker!r}).write_text("closed")
""")


def _holder(tmp_path, hold_s: float) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / "marker"
    code = HOLDER.format(root=str(tmp_path / "store"), marker=str(marker), hold_s=hold_s)
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)  # tests/support
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": path})
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()):
        assert proc.poll() is None, "the holder died before holding the writer"
        assert time.monotonic() < deadline, "the holder never held the writer"
        time.sleep(0.05)
    return proc, marker


def test_a_second_writer_of_one_id_waits_then_sees_the_firsts_rows(tmp_path):
    proc, _ = _holder(tmp_path, hold_s=1.5)
    split = open_split(tmp_path / "store")
    with split.writer("shard-0000-of-0001", rows_per_shard=4) as w:
        # opened only once the holder had closed: its buffered rows are committed too, nothing cleared under it
        # (while it held the id, 4 of the 6 were)
        assert split.committed_prompt_ids() == {f"p{i}" for i in range(6)}
        for pid in ("p6", "p7"):
            w.append(**grad_row(pid))
    assert proc.wait(timeout=60) == 0
    table = GradientStore(str(tmp_path / "store")).open_split(CKPT.name, SPEC["spec_id"], "pool").read()
    assert sorted(table.prompt_ids) == [f"p{i}" for i in range(8)]


def test_a_killed_holder_frees_the_id_and_its_leftovers_are_cleared(tmp_path):
    proc, _ = _holder(tmp_path, hold_s=600)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    split = open_split(tmp_path / "store")
    started = time.monotonic()
    write_grads(split, "shard-0000-of-0001", ["p4", "p5"])  # the holder's buffered rows were lost with it
    assert time.monotonic() - started < 30
    assert split.committed_prompt_ids() == {f"p{i}" for i in range(6)}


def test_a_second_writer_of_one_id_in_the_same_process_is_refused_not_left_waiting(tmp_path):
    """flock is per open file: a second lease in the holder's own process would wait forever. It is refused by
    name instead, and a closed writer lets go of the id."""
    split = open_split(tmp_path / "s")
    first = split.writer("w0")
    with pytest.raises(InvalidInputError, match="already open in this process"):
        split.writer("w0")
    with split.writer("w1") as other:  # another id is free
        other.append(**grad_row("b"))
    first.append(**grad_row("a"))
    first.close()
    with split.writer("w0") as again:
        assert again is not None
    lease = WriterLease(_local(), str(tmp_path / "t"), "x")
    lease.release()
    assert WriterLease(_local(), str(tmp_path / "t"), "x").held
    assert split.committed_prompt_ids() == {"a", "b"}


def _local():
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()
