"""A full device (or quota) stops a write with an error that says so and what to do, keeps what was
stored, and the job resumes once there is room (the device fills by ``support.disk.fill_after``)."""

from __future__ import annotations

import errno
import os

import pytest

from cropi.errors import CropiError, StorageFullError, storage_full
from cropi.utils import fsio
from cropi_service.jobs.worker import error_payload
from support.disk import fill_after


def test_a_full_device_stops_a_write_with_what_to_do_and_keeps_the_old_file(tmp_path, monkeypatch):
    fs, base = fsio.resolve(str(tmp_path))
    target = f"{base}/store/commit.json"
    fsio.write_json_atomic(fs, target, {"shards": ["a"]})
    failed = fill_after(monkeypatch, 0)
    with pytest.raises(StorageFullError) as caught:
        fsio.write_json_atomic(fs, target, {"shards": ["a", "b"]})
    err = caught.value
    assert failed and isinstance(err, OSError) and err.errno == errno.ENOSPC and err.code == "storage_full"
    message = str(err)
    assert target in message and "GB free of" in message and "rerun the same command" in message
    assert fsio.read_json(fs, target) == {"shards": ["a"]}  # the old file, whole
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["commit.json"]  # no temporary left


@pytest.mark.parametrize("code, full", [(errno.EDQUOT, True), (errno.EACCES, False), (errno.EIO, False)])
def test_only_a_full_device_or_quota_is_named_full(tmp_path, monkeypatch, code, full):
    fs, base = fsio.resolve(str(tmp_path))
    fill_after(monkeypatch, 0, code)
    with pytest.raises(OSError) as caught:
        fsio.atomic_write_bytes(fs, f"{base}/x.bin", b"12345678")
    assert isinstance(caught.value, StorageFullError) is full and caught.value.errno == code
    assert os.listdir(tmp_path) == []
    assert (storage_full(caught.value) is not None) is full


def test_a_failed_job_records_a_full_device_as_such_wherever_it_was_raised(tmp_path):
    raw = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "ckpt" / "model.safetensors"))
    payload = error_payload(raw)  # not through fsio: a trainer's checkpoint, say
    assert payload["code"] == "storage_full" and "model.safetensors" in payload["message"]
    assert "rerun the same command" in payload["message"]
    assert error_payload(OSError(errno.EIO, "I/O error"))["code"] == "job_error"
    assert StorageFullError.http_status == 507 and issubclass(StorageFullError, CropiError)
