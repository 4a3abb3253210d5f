"""Golden case: for a fixed input the `cropi` command's stored trajectories and vectors are
bitwise, and its ranking exactly, what the code gave before the structure refactor.

The values in tests/golden/golden.json were produced by the ORIGINAL code (commit 12489f8)
with ``python tests/test_golden.py --write``; the prompt files beside it are fixed inputs
(tests/golden/make_inputs.py). The model is the demo's warm-started tiny model as shipped
then (tests/golden/model), so the rewards are mixed and the vectors carry signal. Everything runs on CPU in a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from support.golden import COLLECT, GOLDEN, HERE, MODEL, cli as _cli  # noqa: F401

SPLITS = ("pool", "val_a", "val_b")
PROJECTIONS = {"f32": ["--projection-dim", "256", "--kept-fraction", "0.5", "--dtype", "float32"],
               "f16": ["--projection-dim", "128", "--projection-kind", "gaussian", "--kept-fraction", "0.25"]}


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def capture(root: Path) -> dict:
    """Run the fixed case through the CLI under ``root``; return what is pinned."""
    from cropi.store import GradientStore, TrajectoryStore

    assert (MODEL / "config.json").is_file(), f"the golden case needs its model at {MODEL}"
    out: dict = {"trajectories": {}, "vectors": {}, "rankings": {}}
    for split in SPLITS:
        traj = root / "traj" / split
        _cli("collect", "--model", str(MODEL), "--prompts", str(GOLDEN / f"{split}.jsonl"), "--out", str(traj),
             *COLLECT)
        t = TrajectoryStore.open(str(traj)).read_table().sort_by([("prompt_id", "ascending"),
                                                                   ("sample_index", "ascending")])
        rows = {c: t[c].to_pylist() for c in ("prompt_id", "sample_index", "response_token_ids",
                                               "behavior_logprobs", "reward")}
        out["trajectories"][split] = _sha(json.dumps(rows, sort_keys=True).encode())
    for tag, proj in PROJECTIONS.items():
        store = root / f"store-{tag}"
        for split in SPLITS:
            _cli("gradients", "--model", str(MODEL), "--trajectories", str(root / "traj" / split),
                 "--store", str(store), "--split", split, "--name", "golden", *proj)
        ranked = _cli("rank", "--store", str(store), "--name", "golden", "--pool", "pool",
                      "--validation", "val_a,val_b", "--top-fraction", "0.25")
        spec_id = ranked["meta"]["spec_id"]
        gs = GradientStore(str(store))
        for split in SPLITS:
            g = gs.open_split("golden", spec_id, split).read()
            order = np.argsort(np.asarray(g.prompt_ids))
            vec = np.ascontiguousarray(g.vectors[order])
            out["vectors"][f"{tag}/{split}"] = {
                "dtype": str(vec.dtype), "shape": list(vec.shape), "sha256": _sha(vec.tobytes()),
                "status": [g.columns["status"][i] for i in order],
                "raw_norm": [float(g.columns["raw_norm"][i]).hex() for i in order]}
        cols = ["prompt_id", "rank", "status", "fused", "score:val_a", "score:val_b", "selected"]
        out["rankings"][tag] = {"spec_id": spec_id, "excluded": ranked["meta"]["excluded"],
                                "rows": [[_exact(r[c]) for c in cols] for r in ranked["rows"]]}
    return out


def _exact(v):
    return float(v).hex() if isinstance(v, float) else v


def test_cli_output_is_bitwise_the_golden_case(tmp_path):
    expected = json.loads((GOLDEN / "golden.json").read_text())
    got = capture(tmp_path)
    assert got["trajectories"] == expected["trajectories"]
    for key, want in expected["vectors"].items():
        assert got["vectors"][key] == want, f"stored vectors of {key} changed"
    assert got["rankings"] == expected["rankings"]
    assert any(s == "ok" for v in expected["vectors"].values() for s in v["status"]), "golden case has signal"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (GOLDEN / "golden.json").write_text(json.dumps(capture(Path(d)), indent=1) + "\n")
