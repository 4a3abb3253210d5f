"""The benchmarks' own store builders keep up with the store's schema: a tiny build of each runs
and reads back through the library (a column added to the gradient schema once broke the serving
benchmark's build without any test noticing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cropi.contracts import GRADIENT_OPTIONAL_COLUMNS
from cropi.store import GradientStore

REPO = Path(__file__).resolve().parents[1]


def test_the_serving_benchmark_builds_a_store_the_library_reads(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "service.py"), "--out", str(tmp_path / "out"),
                           "--cache", str(tmp_path / "cache"), "--prompts", "40", "--dim", "16", "--checkpoints", "2",
                           "--validation-prompts", "5", "--build-only"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    built = json.loads(done.stdout)
    assert sorted(built) == ["bench-0", "bench-1"] and all(b["ranked"] == 38 for b in built.values())  # 5% zero
    store = GradientStore(str(next((tmp_path / "cache").iterdir()) / "store"))
    splits = [s for s in store.list_splits() if s["checkpoint"] == "bench-0" and s["split"] == "pool"]
    table = store.open_split("bench-0", splits[0]["spec_id"], "pool").read()
    assert len(table) == 40 and table.vectors.shape == (40, 16)
    assert set(GRADIENT_OPTIONAL_COLUMNS) <= set(table.columns)
