"""Reads that scale with what is asked: a lookup reads and verifies only the record batches
holding the asked rows (per-batch checksums in the commit entry), a bounded cache of verified
parts, concurrent loads coalesced; shards committed before these fields existed still read."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cropi.errors import CorruptDataError, NotFoundError
from cropi.store import CheckpointRef, PartCache, shard_io
from support.store import SPEC, grad_row, open_split, write_grads

DIM = 512  # 1 KB a float16 vector


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of about 4 KB, so a shard of a few dozen rows has several batches."""
    monkeypatch.setattr(shard_io, "PART_BYTES", 4096)


def _split(root, name="ckpt-1", writers=(("w0", 40),), rows_per_shard=20):
    split = open_split(root, dtype="float16", spec=SPEC | {"dim": DIM}, dim=DIM,
                       checkpoint=CheckpointRef(name=name, fingerprint=f"fp-{name}"))
    start = 0
    for writer, n in writers:
        write_grads(split, writer, [f"p{i:03d}" for i in range(start, start + n)], rows_per_shard=rows_per_shard,
                    salt=name)
        start += n
    return split


class Reads:
    """Counts whole-shard reads and part reads (the bytes loaded from disk)."""

    def __init__(self, monkeypatch):
        self.whole, self.parts = [], []
        real_whole, real_part = shard_io.read_verified, shard_io.read_part
        monkeypatch.setattr(shard_io, "read_verified", lambda *a: self.whole.append(a[3]["file"]) or real_whole(*a))
        monkeypatch.setattr(shard_io, "read_part",
                            lambda *a: self.parts.append((a[3]["file"], a[4])) or real_part(*a))


def _expected(pids, name):
    """Each row as the writer was given it (brute force: no store involved), cast to float16."""
    return np.stack([np.asarray(grad_row(p, DIM, name)["vector"]).astype(np.float16) for p in pids])


def test_take_matches_what_was_written_in_the_asked_order(tmp_path, small_parts):
    split = _split(tmp_path, writers=(("w0", 40), ("w1", 25)))
    entry = split.dataset.commits()["w0"][0]
    assert len(entry["batches"]) >= 4 and sum(b[2] for b in entry["batches"]) == entry["rows"] == 20
    rng = np.random.default_rng(0)
    index = split.index()
    assert len(index) == 65
    for _ in range(5):
        pids = [f"p{i:03d}" for i in rng.choice(65, size=7, replace=False)]
        got = split.take(pids, index)
        assert got.prompt_ids == pids
        np.testing.assert_array_equal(got.vectors, _expected(pids, "ckpt-1"))
        assert [got.columns["n_responses"][i] for i in range(7)] == [grad_row(p, DIM, "ckpt-1")["n_responses"]
                                                                      for p in pids]
    with pytest.raises(NotFoundError, match="1 of 2 keys.*'nope'"):
        split.take(["p001", "nope"], index)


def test_a_key_committed_by_two_writers_is_read_from_the_first_as_a_full_read_does(tmp_path, small_parts):
    split = _split(tmp_path)
    write_grads(split, "w1", ["p005", "p100"], salt="other")  # p005 again, other values, a later writer
    got = split.take(["p005", "p100"])
    full = split.read()
    np.testing.assert_array_equal(got.vectors, full.get(["p005", "p100"]).vectors)
    np.testing.assert_array_equal(got.vectors[0], _expected(["p005"], "ckpt-1")[0])


def test_three_splits_cycled_read_only_the_parts_asked_never_whole_splits(tmp_path, small_parts, monkeypatch):
    splits = [_split(tmp_path, name=f"ckpt-{c}", writers=(("w0", 60),), rows_per_shard=30) for c in range(3)]
    indexes = [s.index() for s in splits]
    reads = Reads(monkeypatch)
    part_bytes = max(b[1] for s in splits for e in s.dataset.commits()["w0"] for b in e["batches"])
    assert all(len(ix.parts) > 8 for ix in indexes)
    cache = PartCache(max_bytes=8 * part_bytes)  # holds 8 parts: less than one split
    asked = ["p007", "p042"]  # two parts of each split
    for _ in range(10):  # a lookup cycling over three checkpoints
        for s, ix in zip(splits, indexes):
            got = s.take(asked, ix, cache)
            np.testing.assert_array_equal(got.vectors, _expected(asked, s.checkpoint.name))
    assert reads.whole == []  # no shard read whole
    assert len(reads.parts) == 6  # each asked part read once: the six fit in the cache
    assert cache.bytes <= cache.max_bytes
    for s, ix in zip(splits, indexes):  # a sweep over everything stays within the budget
        s.take([f"p{i:03d}" for i in range(60)], ix, cache)
    assert cache.bytes <= cache.max_bytes and reads.whole == []
    assert len(reads.parts) <= 6 + sum(len(ix.parts) for ix in indexes)  # each part at most once more


def test_an_in_place_edit_of_a_shard_region_is_caught_by_a_partial_read(tmp_path, small_parts):
    split = _split(tmp_path)
    entry = split.dataset.commits()["w0"][0]
    ends = np.cumsum([b[2] for b in entry["batches"]])
    batch = int(np.searchsorted(ends, 9, side="right"))  # the batch holding row 9 (p009), not the first
    assert batch > 0
    offset, size, rows, _ = entry["batches"][batch]
    victim = Path(split.dataset.path, "shards", entry["file"])
    data = bytearray(victim.read_bytes())
    vector = _expected(["p009"], "ckpt-1")[0].tobytes()
    at = data.find(vector, offset, offset + size)
    assert at > 0
    data[at + 7] ^= 0x01  # one bit of p009's vector, same size, still well-formed Arrow
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=f"{entry['file']} fails the checksum of its batch {batch}"):
        split.take(["p009"], cache=PartCache(1 << 20))
    np.testing.assert_array_equal(split.take(["p001"]).vectors, _expected(["p001"], "ckpt-1"))  # region intact
    with victim.open("r+b") as f:
        f.truncate(len(data) - 1)
    with pytest.raises(CorruptDataError, match="has .* bytes, committed"):
        split.take(["p001"])


def test_an_edited_keys_sidecar_or_batch_list_is_refused(tmp_path, small_parts):
    split = _split(tmp_path)
    entry = split.dataset.commits()["w0"][0]
    sidecar = Path(split.dataset.path, "shards", entry["file"] + shard_io.KEYS_SUFFIX)
    keys = json.loads(sidecar.read_text())
    keys[0], keys[1] = keys[1], keys[0]  # same bytes, other order: would serve p001's row for p000
    sidecar.write_text(json.dumps(keys, separators=(",", ":")))
    with pytest.raises(CorruptDataError, match="checksum of its keys sidecar"):
        split.index()
    commit = Path(split.dataset.path, "commits", "w0.json")
    doc = json.loads(commit.read_text())
    doc["shards"][1]["batches"][0][2] += 1
    commit.write_text(json.dumps(doc))
    with pytest.raises(CorruptDataError, match="not a valid commit file.*batches cover 21 rows"):
        split.dataset.commits()


def test_shards_committed_before_part_checksums_are_read_whole_and_verified(tmp_path, small_parts, monkeypatch):
    split = _split(tmp_path)
    commit = Path(split.dataset.path, "commits", "w0.json")
    doc = json.loads(commit.read_text())
    for e in doc["shards"]:
        del e["batches"], e["keys"]  # the entry an older cropi wrote
    commit.write_text(json.dumps(doc))
    reads = Reads(monkeypatch)
    cache = PartCache(1 << 20)
    got = split.take(["p003", "p025"], cache=cache)
    np.testing.assert_array_equal(got.vectors, _expected(["p003", "p025"], "ckpt-1"))
    assert reads.parts == [] and len(reads.whole) >= 2  # whole shards, each verified
    victim = Path(split.dataset.path, "shards", doc["shards"][0]["file"])
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="fails its checksum"):
        split.take(["p003"])  # no cache: read again, verified again


def test_a_writer_removes_its_orphaned_keys_sidecar(tmp_path):
    split = _split(tmp_path, rows_per_shard=40)
    shards = Path(split.dataset.path, "shards")
    (shards / "w0-000007.arrow.keys").write_text("[]")  # left by a run killed before its commit
    split.dataset.writer("w0")
    assert sorted(p.name for p in shards.iterdir()) == ["w0-000000.arrow", "w0-000000.arrow.keys"]


def test_concurrent_loads_of_one_part_are_coalesced_and_the_budget_holds():
    cache = PartCache(max_bytes=100)
    calls = []

    def load():
        calls.append(1)
        time.sleep(0.05)
        return "part"

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", 60, load))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["part"] * 8 and len(calls) == 1
    cache.get("k2", 60, lambda: "other")  # 120 > 100: the older part goes
    assert cache.bytes == 60 and len(cache) == 1
    assert cache.get("big", 500, lambda: "big") == "big" and cache.bytes == 60  # served, not kept

    def fail():
        raise OSError("disk")

    with pytest.raises(OSError):
        cache.get("bad", 10, fail)
    assert cache.get("bad", 10, lambda: "ok") == "ok"  # a failed load is not remembered


def test_a_reader_answers_from_the_cache_without_io_or_says_it_cannot(tmp_path, small_parts, monkeypatch):
    from cropi.store import SplitReader

    split = _split(tmp_path)
    reader = SplitReader(split, PartCache(1 << 20))
    assert reader.cached(["p009"]) is None and len(reader.cache) == 0  # not loaded: no read to answer it
    np.testing.assert_array_equal(reader.take(["p009"]).vectors, _expected(["p009"], "ckpt-1"))
    reads = Reads(monkeypatch)
    got = reader.cached(["p009"])
    assert got is not None and got.prompt_ids == ["p009"] and reads.parts == [] and reads.whole == []
    np.testing.assert_array_equal(got.vectors, _expected(["p009"], "ckpt-1"))
    assert "p009" in reader and "nope" not in reader and len(reader) == 40
