"""A model folder's fingerprint, kept per process: the same value as hashing the files afresh, read once
while the files stay as they were, and hashed again as soon as any of them is rewritten, even to the
same size with its old mtime put back."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from cropi.utils import fingerprint as fp


def folder(tmp_path, weights: bytes = b"\x01" * 4096):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "transformers_version": "x"}))
    (tmp_path / "model.safetensors").write_bytes(weights)
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def afresh(path) -> str:
    """The fingerprint's definition, computed here without the module's hashing: length-prefixed relative
    names, canonical JSON without the volatile keys, and the weight file's size then its bytes."""
    digest = hashlib.sha256()
    for name in sorted(["config.json", "model.safetensors", "tokenizer.json"]):
        digest.update(len(name).to_bytes(8, "little") + name.encode())
        raw = (path / name).read_bytes()
        if name.endswith(".json"):
            data = json.loads(raw)
            data = {k: v for k, v in data.items() if k not in ("transformers_version", "_name_or_path")}
            blob = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
            digest.update(len(blob).to_bytes(8, "little") + blob)
        else:
            digest.update(len(raw).to_bytes(8, "little") + raw)
    return digest.hexdigest()[:16]


@pytest.fixture
def reads(monkeypatch):
    """Counts the files hashed; the memo starts empty."""
    monkeypatch.setattr(fp, "_memo", type(fp._memo)())
    hashed = []
    real = fp._hash_file
    monkeypatch.setattr(fp, "_hash_file", lambda digest, f: (hashed.append(f.name), real(digest, f)))
    return hashed


def test_a_settled_folder_is_read_once_and_a_rewrite_is_seen_whatever_its_mtime(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(fp, "RACY_S", 0.0)  # files written before the hash count as settled
    path = folder(tmp_path)
    first = fp.model_fingerprint(path)
    assert first == afresh(path) and len(reads) == 3
    assert fp.model_fingerprint(path) == first and len(reads) == 3  # kept: nothing read again
    before = os.stat(path / "model.safetensors")
    (path / "model.safetensors").write_bytes(b"\x02" * 4096)  # the same size, other weights
    os.utime(path / "model.safetensors", ns=(before.st_atime_ns, before.st_mtime_ns))  # its old mtime back
    changed = fp.model_fingerprint(path)
    assert changed == afresh(path) != first and len(reads) == 6
    (path / "special_tokens_map.json").write_text("{}")  # a file that joins the identity
    assert fp.model_fingerprint(path) != changed and len(reads) == 10


def test_a_folder_written_within_the_racy_window_is_hashed_every_time(tmp_path, reads):
    path = folder(tmp_path)  # just written: its mtime is within RACY_S of the hash
    assert fp.model_fingerprint(path) == fp.model_fingerprint(path) == afresh(path)
    assert len(reads) == 6


def test_the_memo_keeps_the_most_recently_asked_folders(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(fp, "RACY_S", 0.0)
    monkeypatch.setattr(fp, "_KEPT", 2)
    paths = [folder(tmp_path / str(i), bytes([i + 1]) * 64) for i in range(3) if not (tmp_path / str(i)).mkdir()]
    for p in paths:
        fp.model_fingerprint(p)
    assert len(reads) == 9
    fp.model_fingerprint(paths[2])
    fp.model_fingerprint(paths[1])
    assert len(reads) == 9  # both kept
    fp.model_fingerprint(paths[0])  # the first was let go
    assert len(reads) == 12 and len(fp._memo) == 2
