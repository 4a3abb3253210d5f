"""The storage layer: sharded datasets, gradient and trajectory stores, atomic file I/O.

Crash safety is checked with a real child process killed by SIGKILL at the
commit point and in the middle of a shard write; this file is also that child
(see ``_child_main`` at the bottom).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cropi.contracts import GRADIENT_OPTIONAL_COLUMNS
from cropi.errors import CorruptDataError, InvalidInputError, MismatchError, NotFoundError
from cropi.store import (GRADIENT_STATUSES, TRAJECTORY_SCHEMA, CheckpointRef, GradientStore, ShardedDataset,
                         TrajectoryStore, gradient_schema)
from cropi.store import shard_io
from cropi.store.gradient_table import vectors_from_arrow
from cropi.store.sharded import ShardWriter
from cropi.utils import fsio
from support.store import CKPT, DIM, SPEC, grad_row, open_split, write_grads

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- helpers

def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def shard_files(split) -> list[Path]:
    return sorted(p for p in Path(split.dataset.path, "shards").iterdir() if p.suffix != shard_io.KEYS_SUFFIX)


def traj_rows(pid: str, k: int = 4, prompt_len: int = 3, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed + int(hashlib.sha256(pid.encode()).hexdigest()[:8], 16))
    prompt = rng.integers(0, 1000, prompt_len).tolist()
    rows = []
    for s in range(k):
        n = int(rng.integers(1, 6))
        rows.append(dict(prompt_id=pid, sample_index=s, prompt_token_ids=prompt,
                         response_token_ids=rng.integers(0, 1000, n).tolist(),
                         behavior_logprobs=(-rng.random(n)).astype(np.float32).tolist(),
                         response_text=f"answer {s}", reward=None if s == 1 else float(rng.integers(0, 2)),
                         finish_reason="stop" if s % 2 == 0 else "length"))
    return rows


TRAJ_IDENTITY = {"model": {"path": "/models/tiny", "fingerprint": "m1"}, "sampling": {"temperature": 0.5, "n": 4},
                 "seed": 7, "prompts_fingerprint": "p1"}


# ---------------------------------------------------------------- fsio

def test_resolve_local_relative_and_file_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fs, path = fsio.resolve("rel/dir")
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "rel" / "dir")
    fs, path = fsio.resolve(f"file://{tmp_path}/x/")
    assert isinstance(fs, pafs.LocalFileSystem) and path == f"{tmp_path}/x"
    with pytest.raises(InvalidInputError, match="URI"):
        fsio.resolve("nosuchscheme://bucket/x")


def test_atomic_write_overwrites_and_leaves_no_temporaries(tmp_path):
    fs, base = fsio.resolve(str(tmp_path))
    target = f"{base}/a/b/file.bin"
    fsio.atomic_write_bytes(fs, target, b"one")
    fsio.atomic_write_bytes(fs, target, b"second")
    assert Path(target).read_bytes() == b"second"
    assert os.listdir(tmp_path / "a" / "b") == ["file.bin"]
    fsio.write_json_atomic(fs, f"{base}/j.json", {"b": [1, 2], "a": "x"})
    assert fsio.read_json(fs, f"{base}/j.json") == {"a": "x", "b": [1, 2]}
    with pytest.raises(InvalidInputError, match="JSON"):
        fsio.write_json_atomic(fs, f"{base}/k.json", {"x": float("nan")})
    with pytest.raises(NotFoundError):
        fsio.read_json(fs, f"{base}/missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CorruptDataError, match="not valid JSON"):
        fsio.read_json(fs, f"{base}/bad.json")


def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch):
    fs, base = fsio.resolve(str(tmp_path))
    fsio.atomic_write_bytes(fs, f"{base}/f", b"old")

    def broken(path, data):
        Path(path).write_bytes(data[:1])
        raise OSError("disk full")

    monkeypatch.setattr(fsio, "_write_local_synced", broken)
    with pytest.raises(OSError, match="disk full"):
        fsio.atomic_write_bytes(fs, f"{base}/f", b"new content")
    assert os.listdir(tmp_path) == ["f"] and (tmp_path / "f").read_bytes() == b"old"


def test_sha256_file_streams_and_matches_hashlib(tmp_path):
    data = np.random.default_rng(0).bytes(int(2.5 * (1 << 20)))  # several 1 MiB chunks
    (tmp_path / "blob").write_bytes(data)
    fs, base = fsio.resolve(str(tmp_path))
    assert fsio.sha256_file(fs, f"{base}/blob") == hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- gradient store roundtrip

def test_float32_roundtrip_is_bit_exact(tmp_path):
    split = open_split(tmp_path, "float32")
    pids = [f"p{i:02d}" for i in range(13)]
    write_grads(split, "w0", pids, rows_per_shard=5)
    assert len(shard_files(split)) == 3
    t = split.read()
    assert t.prompt_ids == pids and t.vectors.dtype == np.float32 and t.vectors.shape == (13, DIM)
    for i, pid in enumerate(pids):
        want = grad_row(pid)
        assert t.vectors[i].tobytes() == want["vector"].astype(np.float32).tobytes()
        for c in ("raw_norm", "reward_mean", "reward_std", "n_responses", "n_tokens", "status"):
            assert t.columns[c][i] == want[c]
    assert t.checkpoint == CKPT and t.spec == SPEC and t.split == "pool"


def test_float16_is_stored_as_float16_of_the_input(tmp_path):
    split = open_split(tmp_path, "float16")
    pids = [f"q{i}" for i in range(6)]
    write_grads(split, "w0", pids)
    t = GradientStore(str(tmp_path)).open_split(CKPT.name, SPEC["spec_id"], "pool").read()
    assert t.vectors.dtype == np.float16
    want = np.stack([grad_row(p)["vector"].astype(np.float16) for p in pids])
    assert t.vectors.tobytes() == want.tobytes()


def test_vector_dim_dtype_and_status_errors(tmp_path):
    split = open_split(tmp_path, "float16")
    with split.writer("w0") as w:
        row = grad_row("a")
        with pytest.raises(InvalidInputError, match=f"length {DIM}"):
            w.append(**(row | {"vector": np.zeros(DIM + 1)}))
        with pytest.raises(InvalidInputError, match="overflow float16"):
            w.append(**(row | {"vector": np.full(DIM, 1e6)}))
        with pytest.raises(InvalidInputError, match="status"):
            w.append(**(row | {"status": "great"}))
        with pytest.raises(InvalidInputError, match="n_tokens"):
            w.append(**(row | {"n_tokens": 3.5}))
        w.append(**row)
        with pytest.raises(InvalidInputError, match="already has a gradient"):
            w.append(**row)
    assert split.committed_prompt_ids() == {"a"}
    with split.writer("w0") as w, pytest.raises(InvalidInputError, match="already has a gradient"):
        w.append(**row)


def test_gradient_table_index_get_and_comparability(tmp_path):
    split = open_split(tmp_path)
    pids = [f"p{i}" for i in range(8)]
    write_grads(split, "w0", pids, rows_per_shard=3)
    t = split.read()
    assert [t.index(p) for p in pids] == list(range(8))
    sub = t.get(["p5", "p1"])
    assert sub.prompt_ids == ["p5", "p1"]
    assert np.array_equal(sub.vectors, t.vectors[[5, 1]])
    assert list(sub.columns["status"]) == [t.columns["status"][5], t.columns["status"][1]]
    with pytest.raises(NotFoundError, match="nope"):
        t.get(["p1", "nope"])
    with pytest.raises(NotFoundError, match="nope"):
        t.index("nope")
    other_spec = open_split(tmp_path, spec=SPEC | {"spec_id": "spec1"}, split="val")
    write_grads(other_spec, "w0", ["v0"])
    with pytest.raises(MismatchError, match="'spec0'.*'spec1'"):
        t.ensure_comparable(other_spec.read())
    other_ckpt = open_split(tmp_path, checkpoint=CheckpointRef(name="ckpt-1b", fingerprint="fp-bbbb"), split="val")
    write_grads(other_ckpt, "w0", ["v0"])
    with pytest.raises(MismatchError, match="fp-aaaa.*fp-bbbb"):
        t.ensure_comparable(other_ckpt.read())
    same = open_split(tmp_path, split="val")
    write_grads(same, "w0", ["v0"])
    t.ensure_comparable(same.read())


def test_empty_split_reads_empty_and_version_tracks_commits(tmp_path):
    split = open_split(tmp_path, "float16")
    t = split.read()
    assert t.prompt_ids == [] and t.vectors.shape == (0, DIM) and t.vectors.dtype == np.float16
    assert len(t.columns["status"]) == 0
    v0 = split.version()
    write_grads(split, "w0", ["a"])
    v1 = split.version()
    write_grads(split, "w1", ["b"])
    assert len({v0, v1, split.version()}) == 3
    assert open_split(tmp_path, "float16").version() == split.version()


def test_open_split_and_list_splits(tmp_path):
    gs = GradientStore(str(tmp_path))
    assert gs.list_splits() == []
    write_grads(open_split(tmp_path, split="pool"), "w0", ["a", "b", "c"])
    write_grads(open_split(tmp_path, split="val", dtype="float16"), "w0", ["x"])
    got = {s["split"]: s for s in gs.list_splits()}
    assert got["pool"]["rows"] == 3 and got["val"]["rows"] == 1 and got["val"]["dtype"] == "float16"
    assert {s["checkpoint"] for s in got.values()} == {CKPT.name}
    with pytest.raises(NotFoundError, match="ckpt-1/spec0/pool"):
        gs.open_split(CKPT.name, "spec0", "missing")
    with pytest.raises(InvalidInputError, match="split name"):
        gs.open_split(CKPT.name, "spec0", "../evil")
    with pytest.raises(InvalidInputError, match="spec_id"):
        gs.split(CKPT, {"seed": 1}, "pool", dim=4)


# ---------------------------------------------------------------- crash safety

def test_failed_commit_leaves_nothing_partial_and_resumes(tmp_path, monkeypatch):
    pids = [f"p{i:02d}" for i in range(11)]
    clean = open_split(tmp_path / "clean")
    write_grads(clean, "w0", pids)
    split = open_split(tmp_path / "crash")
    real = ShardWriter._write_commit
    calls = []

    def fail_from_second(self, entries):  # the storage dies after one good commit
        calls.append(len(entries))
        if len(calls) >= 2:
            raise OSError("simulated crash between shard file and commit file")
        real(self, entries)

    monkeypatch.setattr(ShardWriter, "_write_commit", fail_from_second)
    with pytest.raises(OSError, match="simulated"):
        with split.writer("w0", rows_per_shard=4) as w:
            for pid in pids:
                w.append(**grad_row(pid))
    monkeypatch.setattr(ShardWriter, "_write_commit", real)
    assert split.committed_prompt_ids() == set(pids[:4])
    assert split.read().prompt_ids == pids[:4]
    assert [f.name for f in shard_files(split)] == ["w0-000000.arrow", "w0-000001.arrow"]  # one orphan
    write_grads(split, "w0", pids)  # reopening the writer removes the orphan first
    assert "w0-000001.arrow" not in [f.name for f in shard_files(split)]
    assert split.dataset.read().equals(clean.dataset.read())


@pytest.mark.parametrize("kill_point", ["before_commit", "mid_shard_write"])
def test_sigkilled_writer_leaves_nothing_partial_and_resumes(tmp_path, kill_point):
    pids = [f"p{i:02d}" for i in range(10)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__, str(tmp_path / "crash"), kill_point, ",".join(pids)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    split = open_split(tmp_path / "crash")
    assert split.committed_prompt_ids() == set(pids[:4])  # two shards of 2 committed, the third killed
    leftovers = [f.name for f in shard_files(split) if f.name not in {"w0-000000.arrow", "w0-000001.arrow"}]
    assert len(leftovers) == 1  # the killed shard: complete-but-uncommitted, or a half-written temporary
    assert (".tmp-" in leftovers[0]) == (kill_point == "mid_shard_write")
    assert split.read().prompt_ids == pids[:4]
    write_grads(split, "w0", pids, rows_per_shard=2)
    assert not any(f.name == leftovers[0] for f in shard_files(split))
    sidecars = sorted(p.name for p in Path(split.dataset.path, "shards").glob("*" + shard_io.KEYS_SUFFIX))
    assert sidecars == sorted(e["file"] + shard_io.KEYS_SUFFIX for e in split.dataset.commits()["w0"])
    clean = open_split(tmp_path / "clean")
    write_grads(clean, "w0", pids, rows_per_shard=2)
    assert split.dataset.read().equals(clean.dataset.read())


def test_writer_only_removes_its_own_orphans(tmp_path):
    split = open_split(tmp_path)
    write_grads(split, "a", ["x"])
    shards = Path(split.dataset.path, "shards")
    (shards / "b-000000.arrow").write_bytes(b"in flight")  # another worker, mid-commit
    (shards / "a-000007.arrow").write_bytes(b"killed")
    (shards / "a-000008.arrow.tmp-0123abcd").write_bytes(b"half")
    (shards / "a-000008.arrow.keys").write_bytes(b"[]")  # a killed commit's keys sidecar
    (shards / "b-000000.arrow.keys").write_bytes(b"[]")
    write_grads(split, "a", ["y"])
    names = sorted(f.name for f in shards.iterdir())
    assert names == ["a-000000.arrow", "a-000000.arrow.keys", "a-000009.arrow", "a-000009.arrow.keys",
                     "b-000000.arrow", "b-000000.arrow.keys"]  # numbering never reuses
    assert split.read().prompt_ids == ["x", "y"]


# ---------------------------------------------------------------- integrity

def test_checksum_corruption_is_detected(tmp_path):
    split = open_split(tmp_path)
    write_grads(split, "w0", [f"p{i}" for i in range(6)], rows_per_shard=3)
    split.read()
    victim = shard_files(split)[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=f"{victim.name}.*checksum.*Remove its entry"):
        split.read()
    victim.write_bytes(bytes(data[:-10]))
    with pytest.raises(CorruptDataError, match="bytes, committed"):
        split.read()
    victim.unlink()
    with pytest.raises(CorruptDataError, match="missing"):
        split.read()


def test_same_size_same_mtime_corruption_after_a_verified_read_is_caught(tmp_path):
    split = open_split(tmp_path)
    write_grads(split, "w0", [f"p{i}" for i in range(6)], rows_per_shard=3)
    before = split.read()
    victim = shard_files(split)[0]
    stat = victim.stat()
    data = bytearray(victim.read_bytes())
    offset = data.find(np.asarray(before.vectors[0], dtype=np.float32).tobytes())
    assert offset > 0
    data[offset] ^= 0x01  # one bit of the first vector: still a well-formed Arrow file
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and mtime as verified before
    assert victim.stat().st_size == stat.st_size and victim.stat().st_mtime_ns == stat.st_mtime_ns
    with pytest.raises(CorruptDataError, match=f"{victim.name}.*checksum"):
        split.read()


def test_every_read_hashes_the_bytes_it_parses(tmp_path, monkeypatch):
    split = open_split(tmp_path)
    write_grads(split, "w0", [f"p{i}" for i in range(6)], rows_per_shard=2)
    hashed = []
    real = shard_io.read_verified
    monkeypatch.setattr(shard_io, "read_verified", lambda *a: hashed.append(a[3]["file"]) or real(*a))
    sidecars = []
    real_keys = shard_io.read_keys
    monkeypatch.setattr(shard_io, "read_keys", lambda *a: sidecars.append(a[3]["file"]) or real_keys(*a))
    split.read()
    split.read()
    split.committed_prompt_ids()  # the keys sidecars, each checked against its own sha256
    assert len(hashed) == 6 and len(sidecars) == 3  # 3 shards x 2 reads + 3 sidecars, none skipped


def test_a_table_already_read_does_not_change_with_the_file(tmp_path):
    split = open_split(tmp_path)
    write_grads(split, "w0", [f"p{i}" for i in range(4)], rows_per_shard=4)
    t = split.read()
    kept = t.vectors.copy()
    victim = shard_files(split)[0]
    victim.write_bytes(bytes(len(victim.read_bytes())))  # zeroed in place, same size
    np.testing.assert_array_equal(t.vectors, kept)


_READ_TWICE = """
import sys, numpy as np
from pathlib import Path
from cropi.errors import CorruptDataError
from cropi.store import GradientStore
split = GradientStore(sys.argv[1]).open_split(*sys.argv[2:5])
held = split.read()  # held like the service's cache holds it
victim = sorted(Path(split.dataset.path, "shards").glob("*.arrow"))[0]
with open(victim, "r+b") as f:
    f.truncate(100)  # the vectors' pages now lie past the end of the file
print("sum", float(np.asarray(held.vectors, dtype=np.float64).sum()), flush=True)
try:
    split.read()
except CorruptDataError as e:
    print("refused:", e)
"""


def test_truncating_a_shard_after_a_read_gives_an_error_not_sigbus(tmp_path):
    split = open_split(tmp_path, dim=512, spec=SPEC | {"dim": 512})
    write_grads(split, "w0", [f"p{i}" for i in range(32)], rows_per_shard=32)
    expected = float(np.asarray(split.read().vectors, dtype=np.float64).sum())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", _READ_TWICE, str(tmp_path), CKPT.name, split.spec["spec_id"],
                           "pool"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"reader died with {proc.returncode}: {proc.stderr[-2000:]}"
    assert f"sum {expected}" in proc.stdout  # the table read before the truncation is intact
    assert "refused:" in proc.stdout and "w0-000000.arrow has" in proc.stdout and "bytes, committed" in proc.stdout


def test_key_range_reads_include_shards_whose_range_ends_exactly_at_a_wanted_key(tmp_path):
    split = open_split(tmp_path)
    write_grads(split, "w0", [f"p{i}" for i in range(9)], rows_per_shard=3)  # p0-p2, p3-p5, p6-p8
    ranges = [(e["first_key"], e["last_key"]) for e in split.dataset.commits()["w0"]]
    assert ranges == [("p0", "p2"), ("p3", "p5"), ("p6", "p8")]
    for wanted in ({"p2", "p6"}, {"p2"}, {"p6"}, {"p0", "p8"}, {"p5", "p3"}):
        got = [k for t in split.dataset.iter_shards(keys=wanted) for k in t.column("prompt_id").to_pylist()]
        assert sorted(got) == sorted(wanted)
    store = TrajectoryStore.create_or_open(str(tmp_path / "t"), TRAJ_IDENTITY)
    with store.writer("w0", prompts_per_shard=2) as w:
        for p in ["t0", "t1", "t2", "t3"]:
            w.commit_prompt_rows(traj_rows(p))
    assert [t.prompt_id for t in store.iter_prompts(["t1", "t2"])] == ["t1", "t2"]


def _edit_commit(dataset, writer_id: str, index: int, **fields) -> None:
    path = Path(dataset.path, "commits", f"{writer_id}.json")
    doc = json.loads(path.read_text())
    doc["shards"][index].update(fields)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("fields, match", [
    ({"first_key": "t9", "last_key": "t9z"}, "records keys 't9'..'t9z' for shard w0-000001.parquet"),
    ({"last_key": "t2"}, "records keys 't2'..'t2'"),
    ({"first_key": "t5", "last_key": "t1"}, "not a valid commit file.*key range"),
    ({"rows": "3"}, "not a valid commit file.*rows"),
    ({"file": "../../x-000001.parquet"}, "not a valid commit file.*file"),
    ({"sha256": "00"}, "not a valid commit file.*sha256"),
])
def test_a_commit_file_whose_entry_was_edited_is_refused(tmp_path, fields, match):
    store = TrajectoryStore.create_or_open(str(tmp_path), TRAJ_IDENTITY)
    with store.writer("w0", prompts_per_shard=2) as w:
        for p in ["t0", "t1", "t2", "t3"]:
            w.commit_prompt_rows(traj_rows(p))
    _edit_commit(store.dataset, "w0", 1, **fields)
    with pytest.raises(CorruptDataError, match=match):
        store.committed_prompt_ids()  # what a gradients run asks first
    with pytest.raises(CorruptDataError, match=match):
        list(store.iter_prompts(["t2", "t3"]))


def test_prompts_skipped_by_an_edited_key_range_are_not_silently_dropped(tmp_path, monkeypatch):
    store = TrajectoryStore.create_or_open(str(tmp_path), TRAJ_IDENTITY)
    with store.writer("w0", prompts_per_shard=2) as w:
        for p in ["t0", "t1", "t2", "t3"]:
            w.commit_prompt_rows(traj_rows(p))
    committed = store.committed_prompt_ids()
    _edit_commit(store.dataset, "w0", 1, first_key="t9", last_key="t9z")  # edited after the keys were listed
    monkeypatch.setattr(store, "committed_prompt_ids", lambda: committed)
    with pytest.raises(CorruptDataError, match="lie in no shard whose recorded key range holds them"):
        list(store.iter_prompts(["t1", "t2"]))


def test_identity_mismatch_is_refused_and_data_left_intact(tmp_path):
    split = open_split(tmp_path)
    write_grads(split, "w0", ["a", "b"])
    before = files_of(tmp_path)
    with pytest.raises(MismatchError, match=r"spec\.seed \(stored 0, given 1\).*delete"):
        open_split(tmp_path, spec=SPEC | {"seed": 1})
    with pytest.raises(MismatchError, match=r"checkpoint\.fingerprint"):
        open_split(tmp_path, checkpoint=CheckpointRef(name=CKPT.name, fingerprint="other"))
    with pytest.raises(MismatchError, match=r"dtype"):
        open_split(tmp_path, dtype="float16")
    traj = TrajectoryStore.create_or_open(str(tmp_path / "traj"), TRAJ_IDENTITY)
    with traj.writer("w0") as w:
        w.commit_prompt_rows(traj_rows("a"))
    before_traj = files_of(tmp_path)
    with pytest.raises(MismatchError, match=r"sampling\.temperature"):
        TrajectoryStore.create_or_open(str(tmp_path / "traj"), TRAJ_IDENTITY | {"sampling": {"temperature": 1.0,
                                                                                            "n": 4}})
    assert files_of(tmp_path) == before_traj
    assert {k: v for k, v in before_traj.items() if not k.startswith("traj")} == before
    assert open_split(tmp_path).read().prompt_ids == ["a", "b"]


# ---------------------------------------------------------------- many writers

def test_two_writers_union_and_dedup(tmp_path):
    # Two workers, each with its own handle on the split, interleaving commits.
    w_b = open_split(tmp_path).writer("worker-b", rows_per_shard=2)
    w_a = open_split(tmp_path).writer("worker-a", rows_per_shard=2)
    for pid in ["p0", "p1", "p2", "p3"]:
        w_b.append(**grad_row(pid, salt="b"))
    for pid in ["p2", "p4", "p3", "p5"]:  # p2, p3 recomputed by the other worker
        w_a.append(**grad_row(pid, salt="a"))
    w_a.close(), w_b.close()
    split = open_split(tmp_path)
    t = split.read()
    assert sorted(t.prompt_ids) == ["p0", "p1", "p2", "p3", "p4", "p5"]
    assert split.committed_prompt_ids() == set(t.prompt_ids)
    assert t.prompt_ids == ["p2", "p4", "p3", "p5", "p0", "p1"]  # writer order (a, b), first wins
    for pid in ["p2", "p3", "p4", "p5"]:
        assert np.array_equal(t.vectors[t.index(pid)], grad_row(pid, salt="a")["vector"].astype(np.float32))
    assert split.dataset.stats() == {"rows": 8, "shards": 4, "writers": 2}


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["w1", "w2", "w3"]),
                          st.lists(st.integers(0, 12), min_size=1, max_size=5, unique=True)), max_size=8))
def test_read_is_first_occurrence_in_writer_then_commit_order(tmp_path_factory, commits):
    root = tmp_path_factory.mktemp("ds")
    schema = pa.schema([pa.field("prompt_id", pa.string(), nullable=False), pa.field("tag", pa.int64())])
    ds = ShardedDataset(str(root), {"kind": "test"}, "ipc", schema)
    writers, brute = {}, {}
    for n, (wid, keys) in enumerate(commits):
        if wid not in writers:  # one writer per id: a second of one id in this process is refused (store.lease)
            writers[wid] = ds.writer(wid)
        w = writers[wid]
        keys = [f"k{k}" for k in keys if f"k{k}" not in w.committed_keys()]
        w.commit(pa.table({"prompt_id": keys, "tag": [n] * len(keys)}, schema=schema))
        brute.setdefault(wid, []).extend((k, n) for k in keys)
    want, seen = [], set()
    for wid in sorted(brute):
        for k, n in brute[wid]:
            if k not in seen:
                seen.add(k), want.append((k, n))
    got = ds.read()
    assert list(zip(got["prompt_id"].to_pylist(), got["tag"].to_pylist())) == want
    assert ds.committed_keys() == seen


# ---------------------------------------------------------------- schema checks, zero copy, other filesystems

def test_schema_errors_name_the_columns(tmp_path):
    split = open_split(tmp_path)
    w = split.dataset.writer("w0")
    good = {"prompt_id": ["a"], "vector": pa.array([[0.0] * DIM], pa.list_(pa.float32(), DIM)),
            "raw_norm": [1.0], "n_responses": pa.array([2], pa.int32()), "reward_mean": [0.5],
            "reward_std": [0.1], "n_tokens": [10], "status": ["ok"],
            **{c: pa.array([None], pa.float64()) for c in GRADIENT_OPTIONAL_COLUMNS}}
    bad = dict(good, n_tokens=["ten"], extra=[1])
    del bad["raw_norm"]
    with pytest.raises(InvalidInputError) as e:
        w.commit(pa.table(bad))
    msg = str(e.value)
    assert "missing columns ['raw_norm']" in msg and "unexpected columns ['extra']" in msg
    assert "n_tokens is string, expected int64" in msg
    with pytest.raises(InvalidInputError, match=r"nulls in required columns \['status'\]"):
        w.commit(pa.table(dict(good, status=pa.array([None], pa.string()))))
    with pytest.raises(InvalidInputError, match="vector is fixed_size_list"):
        w.commit(pa.table(dict(good, vector=pa.array([[0.0] * 3], pa.list_(pa.float32(), 3)))))
    w.commit(pa.table(good))
    assert split.committed_prompt_ids() == {"a"}
    with pytest.raises(InvalidInputError, match="already committed"):
        w.commit(pa.table(good))
    with pytest.raises(InvalidInputError, match="writer id"):
        split.dataset.writer("../x")


def _mapped_ranges(path: str) -> list[tuple[int, int]]:
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == path:
            lo, hi = parts[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_local_ipc_read_is_owned_memory_not_a_file_mapping(tmp_path):
    split = open_split(tmp_path, dim=512, spec=SPEC | {"dim": 512})
    write_grads(split, "w0", [f"p{i}" for i in range(200)], rows_per_shard=1000)
    path = str(shard_files(split)[0].resolve())
    t = split.read()
    assert t.vectors.nbytes == 200 * 512 * 4
    assert _mapped_ranges(path) == []  # nothing of the shard file is mapped into this process
    assert not t.vectors.flags.writeable
    chunk = split.dataset.read().column("vector").chunk(0)
    view = vectors_from_arrow(pa.chunked_array([chunk]), 512, "float32")
    assert view.ctypes.data == chunk.values.buffers()[1].address  # no second copy after the read


def test_non_local_filesystem_path(tmp_path):
    # A SubTreeFileSystem is not LocalFileSystem: exercises the streamed (not mmapped) branches.
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    ds = ShardedDataset("ds", {"kind": "gradients-like"}, "ipc", gradient_schema(4, "float32"), filesystem=fs)
    row = {"prompt_id": ["a", "b"], "vector": pa.array([[1, 2, 3, 4], [5, 6, 7, 8]], pa.list_(pa.float32(), 4)),
           "raw_norm": [1.0, 2.0], "n_responses": pa.array([1, 2], pa.int32()), "reward_mean": [0.0, 1.0],
           "reward_std": [0.0, 0.5], "n_tokens": [3, 4], "status": ["ok", "truncated"],
           "ess": pa.array([2.0, None], pa.float64()), "ess_fraction": pa.array([1.0, None], pa.float64()),
           "p_theta": pa.array([0.0, None], pa.float64()), "std_theta": pa.array([0.0, None], pa.float64()),
           "log_mean_weight": pa.array([0.0, None], pa.float64())}
    ds.writer("w").commit(pa.table(row))
    again = ShardedDataset("ds", filesystem=fs)
    assert again.read().column("prompt_id").to_pylist() == ["a", "b"]
    assert not list(tmp_path.rglob("*.tmp-*"))


# ---------------------------------------------------------------- trajectories

def test_trajectory_roundtrip_grouping_and_order(tmp_path):
    store = TrajectoryStore.create_or_open(str(tmp_path), TRAJ_IDENTITY)
    pids = [f"t{i}" for i in range(7)]
    given = {p: traj_rows(p, k=3 + i % 3) for i, p in enumerate(pids)}
    with store.writer("w0", prompts_per_shard=3) as w:
        for p in pids:
            w.commit_prompt_rows(given[p][::-1])  # sample order must not matter
    assert len(store.dataset.commits()["w0"]) == 3
    assert store.read_table().num_rows == sum(len(r) for r in given.values())
    got = list(TrajectoryStore.open(str(tmp_path)).iter_prompts())
    assert [g.prompt_id for g in got] == pids
    for g in got:
        rows = given[g.prompt_id]
        assert g.prompt_token_ids == rows[0]["prompt_token_ids"]
        assert g.responses == [r["response_token_ids"] for r in rows]
        assert g.behavior_logprobs == [r["behavior_logprobs"] for r in rows]  # float32 values, exact
        assert g.rewards == [r["reward"] for r in rows] and g.rewards[1] is None
        assert g.finish_reasons == [r["finish_reason"] for r in rows]
        assert g.texts == [r["response_text"] for r in rows]
    subset = list(store.iter_prompts(["t5", "t0"]))
    assert sorted(s.prompt_id for s in subset) == ["t0", "t5"]
    with pytest.raises(NotFoundError, match="nope"):
        list(store.iter_prompts(["t0", "nope"]))


def _bad(mutate):
    rows = traj_rows("bad", k=3)
    mutate(rows)
    return rows


@pytest.mark.parametrize("rows, match", [
    (_bad(lambda r: r[1].pop("reward")), r"missing \['reward'\]"),
    (_bad(lambda r: r[0].update(extra=1)), r"unexpected \['extra'\]"),
    (_bad(lambda r: r[2].update(prompt_id="other")), "different prompt_ids"),
    (_bad(lambda r: r[2].update(sample_index=0)), "sample_index repeats"),
    (_bad(lambda r: r[1].update(prompt_token_ids=[9, 9])), "disagree on prompt_token_ids"),
    (_bad(lambda r: r[0].update(behavior_logprobs=r[0]["behavior_logprobs"] + [-1.0])), "one per token"),
    (_bad(lambda r: r[0].update(reward=float("nan"))), "finite number"),
    (_bad(lambda r: r[0].update(response_token_ids=["x"])), "trajectory schema"),
    (_bad(lambda r: r[0].update(finish_reason=None)), "finish_reason"),
    ([], "non-empty list"),
])
def test_bad_prompt_rows_are_rejected_whole(tmp_path, rows, match):
    store = TrajectoryStore.create_or_open(str(tmp_path), TRAJ_IDENTITY)
    with store.writer("w0") as w:
        w.commit_prompt_rows(traj_rows("good"))
        with pytest.raises(InvalidInputError, match=match):
            w.commit_prompt_rows(rows)
    assert store.committed_prompt_ids() == {"good"}


def test_prompts_are_all_or_nothing_when_a_commit_fails(tmp_path, monkeypatch):
    store = TrajectoryStore.create_or_open(str(tmp_path), TRAJ_IDENTITY)
    monkeypatch.setattr(ShardWriter, "_write_commit", lambda self, e: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        with store.writer("w0", prompts_per_shard=2) as w:
            w.commit_prompt_rows(traj_rows("a"))
            w.commit_prompt_rows(traj_rows("b"))
    monkeypatch.undo()
    assert store.committed_prompt_ids() == set() and store.read_table().num_rows == 0
    with store.writer("w0") as w:
        w.commit_prompt_rows(traj_rows("a"))
        w.commit_prompt_rows(traj_rows("c"))
    assert [p.prompt_id for p in store.iter_prompts()] == ["a", "c"]
    assert [f.name for f in (tmp_path / "shards").iterdir()] == ["w0-000001.parquet"]


def _writers(tmp_path):
    """Each buffering writer (cropi.store.sharded.BufferedWriter) with a way to buffer one item and to list what
    its store has committed."""
    store = TrajectoryStore.create_or_open(str(tmp_path / "traj"), TRAJ_IDENTITY)
    split = open_split(tmp_path / "grads")
    return [("trajectories", lambda: store.writer("w0", prompts_per_shard=8),
             lambda w, pid: w.commit_prompt_rows(traj_rows(pid)), store.committed_prompt_ids),
            ("gradients", lambda: split.writer("w0", rows_per_shard=8),
             lambda w, pid: w.append(**grad_row(pid)), split.committed_prompt_ids)]


def test_a_failing_caller_keeps_what_its_writer_buffered_and_frees_the_id(tmp_path):
    """Buffered items are complete results: a caller that fails inside ``with writer`` still commits them, its own
    error is what propagates, and the writer id is free for the next writer (else that one would wait on it)."""
    for what, make, put, committed in _writers(tmp_path):
        with pytest.raises(RuntimeError, match="caller"):
            with make() as w:
                put(w, "a")
                put(w, "b")
                assert w.buffered() == 2 and committed() == set()
                raise RuntimeError("the caller failed")
        assert committed() == {"a", "b"}, what
        with make() as w:  # the id is free again
            put(w, "c")
        assert committed() == {"a", "b", "c"}, what


def test_a_full_disk_while_the_caller_fails_is_logged_once_and_the_callers_error_propagates(tmp_path, monkeypatch,
                                                                                            caplog):
    from cropi.errors import StorageFullError

    def full(self, entries):
        raise StorageFullError("no space left on the device: free some")

    for what, make, put, committed in _writers(tmp_path):
        with monkeypatch.context() as m:
            m.setattr(ShardWriter, "_write_commit", full)
            caplog.clear()
            with pytest.raises(KeyError):
                with make() as w:
                    put(w, "x")
                    raise KeyError("the caller's own error")
        warned = [r for r in caplog.records if r.levelname == "WARNING"]
        assert [r.getMessage() for r in warned] == [f"could not commit 1 buffered {what}: no space left on the "
                                                    "device: free some"]
        assert not [r for r in caplog.records if r.levelname == "ERROR"] and committed() == set()


def test_corrupt_trajectory_rows_raise_on_read(tmp_path):
    store = TrajectoryStore.create_or_open(str(tmp_path), TRAJ_IDENTITY)
    rows = traj_rows("x", k=2)
    rows[1]["behavior_logprobs"] = []  # bypass the writer's checks, as a foreign tool might
    store.dataset.writer("raw").commit(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA))
    with pytest.raises(CorruptDataError, match="prompt 'x'.*one per token"):
        list(store.iter_prompts())


def test_trajectory_store_open_fingerprint_and_kind(tmp_path):
    with pytest.raises(NotFoundError, match="no dataset"):
        TrajectoryStore.open(str(tmp_path / "none"))
    store = TrajectoryStore.create_or_open(str(tmp_path / "t"), TRAJ_IDENTITY)
    assert store.identity == {"kind": "trajectories", **TRAJ_IDENTITY}
    empty = store.fingerprint
    assert TrajectoryStore.open(str(tmp_path / "t")).fingerprint == empty
    with store.writer("w0") as w:
        w.commit_prompt_rows(traj_rows("a"))
    assert store.fingerprint != empty and len(store.fingerprint) == 16
    with pytest.raises(InvalidInputError, match="kind 'trajectories'"):
        TrajectoryStore.create_or_open(str(tmp_path / "k"), TRAJ_IDENTITY | {"kind": "gradients"})
    assert not (tmp_path / "k").exists()
    with pytest.raises(MismatchError, match="not trajectories"):
        TrajectoryStore.open(open_split(tmp_path / "g").dataset.path)


def test_manifest_is_readable_json(tmp_path):
    split = open_split(tmp_path)
    manifest = json.loads(Path(split.dataset.path, "manifest.json").read_text())
    assert manifest["identity"]["checkpoint"] == CKPT.model_dump()
    assert manifest["columns"]["vector"] == f"fixed_size_list<item: float>[{DIM}]"
    assert manifest["identity"]["dim"] == DIM and manifest["format"] == "ipc" and manifest["key"] == "prompt_id"


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["identity"].update(dim=DIM // 2), f"identity dim is {DIM // 2}, but its vector column holds {DIM}"),
    (lambda m: m["identity"].update(dtype="float16"), "identity dtype is 'float16', but its vector column holds float"),
    (lambda m: m["columns"].update(vector="fixed_size_list<item: float>[2]"), "columns .* do not match its schema"),
    (lambda m: m["identity"]["checkpoint"].update(fingerprint="other"), "its content does not match its recorded content_sha256"),
])
def test_an_edited_manifest_is_refused_naming_it(tmp_path, edit, match):
    split = open_split(tmp_path)
    write_grads(split, "w0", ["p0", "p1"])
    path = Path(split.dataset.path, "manifest.json")
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(CorruptDataError, match=f"{path} was edited after it was written: {match}"):
        GradientStore(str(tmp_path)).open_split(CKPT.name, SPEC["spec_id"], "pool").read()
    with pytest.raises(CorruptDataError, match="was edited"):
        open_split(tmp_path)  # reopening for writing is refused too


def test_a_manifest_from_before_content_checksums_still_opens(tmp_path):
    split = open_split(tmp_path)
    write_grads(split, "w0", ["p0", "p1"])
    path = Path(split.dataset.path, "manifest.json")
    manifest = json.loads(path.read_text())
    del manifest["content_sha256"]
    path.write_text(json.dumps(manifest))
    assert GradientStore(str(tmp_path)).open_split(CKPT.name, SPEC["spec_id"], "pool").read().prompt_ids == ["p0", "p1"]


# ---------------------------------------------------------------- rankings

def _ranking_table(n: int = 40) -> tuple[pa.Table, dict]:
    rng = np.random.default_rng(3)
    table = pa.table({"prompt_id": [f"q{i:03d}" for i in range(n)], "status": ["ok"] * n,
                      "rank": pa.array(rng.permutation(n) + 1, pa.int64()), "fused": rng.random(n),
                      "score:val": rng.standard_normal(n), "selected": [bool(i % 3 == 0) for i in range(n)]})
    return table, {"checkpoint": "c", "spec_id": "s", "pool": "pool", "validation": ["val"], "fusion": "rrf"}


def test_ranking_roundtrip_and_nothing_left_behind(tmp_path):
    from cropi.store import rankings
    table, meta = _ranking_table()
    rankings.save(str(tmp_path), "c", "s", "pool", table, meta)
    got, got_meta = rankings.load(str(tmp_path), "c", pool="pool", spec_id="s")
    assert got.equals(table) and got_meta == meta
    folder = tmp_path / "rankings" / "c" / "s"
    assert sorted(p.name for p in folder.iterdir()) == ["pool.parquet", "pool.parquet.sha256.json"]
    assert len(json.loads((folder / "pool.parquet.sha256.json").read_text())["accept"]) == 1
    table2 = table.set_column(3, "fused", pa.array(np.zeros(table.num_rows)))
    rankings.save(str(tmp_path), "c", "s", "pool", table2, meta)
    assert rankings.load(str(tmp_path), "c")[0].equals(table2)


def test_every_bit_flip_of_a_ranking_is_refused(tmp_path):
    from cropi.store import rankings
    table, meta = _ranking_table()
    rankings.save(str(tmp_path), "c", "s", "pool", table, meta)
    path = tmp_path / "rankings" / "c" / "s" / "pool.parquet"
    good = path.read_bytes()
    rng = np.random.default_rng(0)
    positions = sorted(set(rng.choice(len(good), size=48, replace=False).tolist()) | {0, 4, len(good) - 5,
                                                                                       len(good) - 1})
    outcomes = {"refused": 0, "identical": 0}
    for pos in positions:
        for bit in range(8):
            bad = bytearray(good)
            bad[pos] ^= 1 << bit
            path.write_bytes(bytes(bad))
            try:
                got, got_meta = rankings.load(str(tmp_path), "c")
            except CorruptDataError as e:
                assert str(path) in str(e) and "rerun `cropi rank`" in str(e)
                outcomes["refused"] += 1
            else:  # the only acceptable load is one with identical contents
                assert got.equals(table) and got_meta == meta, f"bit {bit} of byte {pos} changed the ranking"
                outcomes["identical"] += 1
    assert sum(outcomes.values()) == 8 * len(positions)
    for cut in (0, 1, len(good) // 2, len(good) - 1):
        path.write_bytes(good[:cut])
        with pytest.raises(CorruptDataError, match=f"{path}.*bytes"):
            rankings.load(str(tmp_path), "c")
    path.write_bytes(good)
    assert rankings.load(str(tmp_path), "c")[0].equals(table)


def test_a_damaged_or_missing_ranking_checksum_file_is_refused(tmp_path):
    from cropi.store import rankings
    table, meta = _ranking_table()
    rankings.save(str(tmp_path), "c", "s", "pool", table, meta)
    sums = tmp_path / "rankings" / "c" / "s" / "pool.parquet.sha256.json"
    doc = json.loads(sums.read_text())
    doc["accept"][0]["sha256"] = "0" * 64
    sums.write_text(json.dumps(doc))
    with pytest.raises(CorruptDataError, match="pool.parquet fails its checksum"):
        rankings.load(str(tmp_path), "c")
    sums.write_text("{not json")
    with pytest.raises(CorruptDataError, match="sha256.json"):
        rankings.load(str(tmp_path), "c")
    sums.unlink()
    with pytest.raises(CorruptDataError, match="has no checksum file"):
        rankings.load(str(tmp_path), "c")


@pytest.mark.parametrize("crash_at", [1, 2])
def test_a_ranking_rewrite_killed_midway_still_loads_old_or_new(tmp_path, monkeypatch, crash_at):
    from cropi.store import rankings
    old, meta = _ranking_table()
    rankings.save(str(tmp_path), "c", "s", "pool", old, meta)
    new = old.set_column(3, "fused", pa.array(np.zeros(old.num_rows)))
    steps = []
    real_json, real_bytes = rankings.write_json_atomic, rankings.atomic_write_bytes

    def step(real):
        def run(*args):
            if len(steps) == crash_at:
                raise KeyboardInterrupt("killed")
            steps.append(real.__name__)
            return real(*args)
        return run

    monkeypatch.setattr(rankings, "write_json_atomic", step(real_json))
    monkeypatch.setattr(rankings, "atomic_write_bytes", step(real_bytes))
    with pytest.raises(KeyboardInterrupt):
        rankings.save(str(tmp_path), "c", "s", "pool", new, meta)
    got = rankings.load(str(tmp_path), "c")[0]
    assert got.equals(old if crash_at == 1 else new)


# ---------------------------------------------------------------- the child process of the SIGKILL test

def _child_main(root: str, kill_point: str, pids: list[str]) -> None:
    """Write ``pids`` two per shard and SIGKILL this process while writing the third shard."""
    from cropi.store import sharded

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if kill_point == "before_commit":  # shard file complete, commit file not yet rewritten
        real_commit = sharded.ShardWriter._write_commit

        def hook(self, entries):
            if len(entries) == 3:
                die()
            real_commit(self, entries)

        sharded.ShardWriter._write_commit = hook
    else:  # half the bytes of the third shard's temporary file on disk
        real_write = fsio._write_local_synced
        seen = []

        def hook(path, data):
            if "/shards/" in path and shard_io.KEYS_SUFFIX not in path:  # the shard, not its keys sidecar
                seen.append(path)
                if len(seen) == 3:
                    Path(path).write_bytes(data[: len(data) // 2])
                    die()
            real_write(path, data)

        fsio._write_local_synced = hook
    write_grads(open_split(root), "w0", pids, rows_per_shard=2)


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2], sys.argv[3].split(","))
