"""Golden case: for a fixed input the `cropi` command's stored trajectories and vectors are
bitwise, and its ranking exactly, what the ORIGINAL code (commit 12489f8) gave on the same CPU
instruction set, so a refactor that changes any result fails here.

Bitwise float results depend on what decides the arithmetic, not only on the code: which vector
kernels ATen dispatches to (its CPU capability: `default`, `avx2`, `avx512` on x86-64), how many
threads split a reduction, and which branch MKL's sgemm takes. So the case is pinned where it runs:
each capability runs the whole CLI case in a child process with ``ATEN_CPU_CAPABILITY`` set, one
thread, and MKL's conditional-numerical-reproducibility branch fixed (``MKL_CBWR``; otherwise MKL
picks its kernels by CPU vendor and model, and a sampled token can flip at a near-tie). The expected
values are kept per capability in tests/golden/golden.json, each produced by 12489f8's code under
that same pinning with ``python tests/test_golden.py --write`` (run from a tree where ``cropi`` is
that commit's, e.g. ``PYTHONPATH=<git archive 12489f8>``: see the "written_by" entry).

A capability the CPU cannot run (torch falls back to a lower one) is skipped with a message that
names what it needs; under CI (`make test` sets ``CROPI_GOLDEN_CAPABILITIES``) a capability it
asks for must run. The prompt files are fixed inputs (tests/golden/make_inputs.py); the model is the
demo's warm-started tiny model as shipped at 12489f8 (tests/golden/model), so the rewards are mixed
and the vectors carry signal. Each capability runs in a few seconds on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.golden import COLLECT, GOLDEN, HERE, MODEL, cli as _cli  # noqa: E402,F401

SPLITS = ("pool", "val_a", "val_b")
PROJECTIONS = {"f32": ["--projection-dim", "256", "--kept-fraction", "0.5", "--dtype", "float32"],
               "f16": ["--projection-dim", "128", "--projection-kind", "gaussian", "--kept-fraction", "0.25"]}
# Every ATen CPU capability an x86-64 torch build dispatches to, lowest first.
CAPABILITIES = ("default", "avx2", "avx512")
# What each capability needs from the CPU (its /proc/cpuinfo flags), for the skip message.
NEEDS = {"default": "nothing beyond x86-64", "avx2": "AVX2 and FMA",
         "avx512": "AVX-512 (avx512f, avx512bw, avx512vl, avx512dq)"}
# MKL's reproducible branch for each: `COMPATIBLE` runs on any x86-64; AVX2 / AVX512 need the same
# instructions the ATen capability does, so a CPU that runs one runs the other.
MKL_BRANCH = {"default": "COMPATIBLE", "avx2": "AVX2", "avx512": "AVX512"}
NOT_AVAILABLE = 3  # the child's exit code when torch cannot use the capability asked for


def pinned_env(capability: str) -> dict[str, str]:
    """The environment that decides the case's numerics: instruction set, one thread, MKL's branch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATEN_", "MKL_", "OMP_", "ONEDNN_", "DNNL_"))}
    return {**env, "ATEN_CPU_CAPABILITY": capability, "MKL_CBWR": MKL_BRANCH[capability],
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


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
                      "--validation", "val_a,val_b", "--top-fraction", "0.25",
                      "--selector", "cropi")  # the rule the original code had: its selected column is pinned
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


def capture_pinned(capability: str, root: Path) -> dict | str:
    """The case run in a child process pinned to ``capability``: its capture, or, when torch cannot
    use that capability on this CPU, a sentence saying what it needs."""
    out = root / "capture.json"
    proc = subprocess.run([sys.executable, __file__, "--capture", str(out), capability], env=pinned_env(capability),
                          capture_output=True, text=True, timeout=900)
    if proc.returncode == NOT_AVAILABLE:
        return proc.stdout.strip()
    assert proc.returncode == 0, f"the golden case failed under {capability}:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def _required() -> set[str]:
    asked = {c for c in os.environ.get("CROPI_GOLDEN_CAPABILITIES", "").split() if c}
    unknown = asked - set(CAPABILITIES)
    assert not unknown, f"CROPI_GOLDEN_CAPABILITIES names {sorted(unknown)}; known: {', '.join(CAPABILITIES)}"
    return asked


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_cli_output_is_bitwise_the_golden_case(capability, tmp_path):
    required = _required()
    expected = json.loads((GOLDEN / "golden.json").read_text())["by_capability"][capability]
    got = capture_pinned(capability, tmp_path)
    if isinstance(got, str):
        if capability in required:
            pytest.fail(f"CROPI_GOLDEN_CAPABILITIES asks for {capability}, but {got}")
        pytest.skip(got)
    assert got["trajectories"] == expected["trajectories"], f"stored trajectories changed under {capability}"
    for key, want in expected["vectors"].items():
        assert got["vectors"][key] == want, f"stored vectors of {key} changed under {capability}"
    assert got["rankings"] == expected["rankings"], f"the ranking changed under {capability}"
    assert any(s == "ok" for v in expected["vectors"].values() for s in v["status"]), "golden case has signal"


def test_the_golden_values_differ_between_capabilities():
    """Why the values are kept per capability: if every capability gave the same bits, one entry would
    do and this split would hide nothing; if they differ, a single entry cannot pass on every CPU."""
    by = json.loads((GOLDEN / "golden.json").read_text())["by_capability"]
    assert set(by) == set(CAPABILITIES)
    assert len({json.dumps(by[c]["trajectories"], sort_keys=True) for c in CAPABILITIES}) > 1


def test_a_capability_torch_cannot_use_is_refused_by_name(tmp_path):
    """The child checks which capability torch really dispatches to (torch falls back silently to a
    lower one the CPU can run): asked for avx2 while pinned to default, it refuses and says why."""
    proc = subprocess.run([sys.executable, __file__, "--capture", str(tmp_path / "x.json"), "avx2"],
                          env=pinned_env("default"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == NOT_AVAILABLE, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"the golden case under avx2 needs a CPU with {NEEDS['avx2']}; torch runs default here"
    assert not (tmp_path / "x.json").exists()


def _child(out: str, capability: str) -> int:
    """Run in the pinned child: refuse (exit NOT_AVAILABLE) unless torch really uses ``capability``."""
    import torch

    used = torch.backends.cpu.get_cpu_capability().lower()
    if used != capability:
        print(f"the golden case under {capability} needs a CPU with {NEEDS[capability]}; torch runs {used} here")
        return NOT_AVAILABLE
    torch.set_num_threads(1)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        Path(out).write_text(json.dumps(capture(Path(d))))
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--capture"]:
    sys.exit(_child(*sys.argv[2:4]))

if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    # python tests/test_golden.py --write "12489f8 (the original code)": the label names the code that ran
    import tempfile

    by = {}
    for cap in CAPABILITIES:
        with tempfile.TemporaryDirectory() as d:
            got = capture_pinned(cap, Path(d))
        if isinstance(got, str):
            sys.exit(f"cannot write the golden case: {got}")
        by[cap] = got
    doc = {"written_by": {"code": " ".join(sys.argv[2:]) or "the working tree", "pinning": {
        c: {k: v for k, v in pinned_env(c).items() if k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS")}
        for c in CAPABILITIES}}, "by_capability": by}
    (GOLDEN / "golden.json").write_text(json.dumps(doc, indent=1) + "\n")
