"""Golden case: for a fixed input the `cropi` command's stored trajectories, vectors and rankings are
what the ORIGINAL code (commit 12489f8) gave, on any x86-64 machine: exactly where the result is
discrete, within a tolerance float32 arithmetic justifies where it is not (tests/support/golden.py
states and derives each), so a refactor that changes results fails here and a machine that only
orders its sums differently does not.

Each ATen CPU capability (``default``, ``avx2``, ``avx512``) and each OpenBLAS kernel set the CPU can
run (numpy's matrix products: ``OPENBLAS_CORETYPE`` Haswell, Zen, SkylakeX, ...) runs the whole CLI
case in a child process with those set, so a dependence on the instruction set or the BLAS build
shows here rather than on the next machine. One expected record serves them all: the captures
12489f8 wrote per capability agree in every discrete field and within the tolerances (measured there:
scores within 3.1e-7). The expected values come from ``python tests/test_golden.py --write LABEL``;
the f32 and f16 entries were checked bitwise against 12489f8's per-capability hashes when this
format replaced them (``written_by``), the ``default`` entry (the scoring spec and the default
selector) was added by the working tree at that time.

A capability or kernel set the CPU cannot run is skipped with a message naming what it needs; under CI
(`make test` sets ``CROPI_GOLDEN_CAPABILITIES`` and ``CROPI_GOLDEN_CORETYPES``) one it asks for must
run. The prompt files are fixed inputs (tests/golden/make_inputs.py); the model is the demo's
warm-started tiny model as shipped at 12489f8 (tests/golden/model), so the rewards are mixed and the
vectors carry signal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.golden import COLLECT, GOLDEN, MODEL, cli as _cli, compare, score_atol  # noqa: E402

SPLITS = ("pool", "val_a", "val_b")
# tag -> (gradients flags, rank flags). f32 / f16: the original code's two specs under CROPI's rule (the
# rule it had: its selected column is pinned); default: the library's defaults (spec and selector)
PROJECTIONS = {
    "f32": (["--projection-dim", "256", "--projection-kind", "sjlt", "--kept-fraction", "0.5", "--dtype", "float32"],
            ["--selector", "cropi"]),
    "f16": (["--projection-dim", "128", "--projection-kind", "gaussian", "--kept-fraction", "0.25"],
            ["--selector", "cropi"]),
    "default": ([], []),
}
# Every ATen CPU capability an x86-64 torch build dispatches to, lowest first.
CAPABILITIES = ("default", "avx2", "avx512")
# OpenBLAS kernel sets numpy's DYNAMIC_ARCH build carries that matter on today's x86-64 servers.
CORETYPES = ("native", "Haswell", "Zen", "SkylakeX")
# What each needs from the CPU (its /proc/cpuinfo flags), for the skip message and the check.
NEEDS = {"default": "nothing beyond x86-64", "avx2": "AVX2 and FMA",
         "avx512": "AVX-512 (avx512f, avx512bw, avx512vl, avx512dq)"}
AVX2, AVX512 = {"avx2", "fma"}, {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
CAPABILITY_NEEDS = {"default": set(), "avx2": AVX2, "avx512": AVX512}
CORE_NEEDS = {"native": set(), "Haswell": AVX2, "Zen": AVX2, "SkylakeX": AVX512}
# MKL's reproducible branch for each: `COMPATIBLE` runs on any x86-64; AVX2 / AVX512 need the same
# instructions the ATen capability does, so a CPU that runs one runs the other.
MKL_BRANCH = {"default": "COMPATIBLE", "avx2": "AVX2", "avx512": "AVX512"}
NOT_AVAILABLE = 3  # the child's exit code when torch cannot use the capability asked for
# The cases run: every capability with the CPU's own OpenBLAS kernels, and every kernel set under avx2.
CASES = [(c, "native") for c in CAPABILITIES] + [("avx2", k) for k in CORETYPES if k != "native"]


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pinned_env(capability: str, coretype: str = "native") -> dict[str, str]:
    """The environment that decides the case's numerics: instruction set, BLAS kernels, one thread."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ATEN_", "MKL_", "OMP_", "ONEDNN_", "DNNL_", "OPENBLAS_"))}
    env |= {"ATEN_CPU_CAPABILITY": capability, "MKL_CBWR": MKL_BRANCH[capability], "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if coretype != "native":
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def capture(root: Path) -> dict:
    """Run the fixed case through the CLI under ``root``; return what is compared."""
    from cropi.store import GradientStore, TrajectoryStore

    assert (MODEL / "config.json").is_file(), f"the golden case needs its model at {MODEL}"
    out: dict = {"trajectories": {}, "vectors": {}, "rankings": {}}
    for split in SPLITS:
        traj = root / "traj" / split
        _cli("collect", "--model", str(MODEL), "--prompts", str(GOLDEN / f"{split}.jsonl"), "--out", str(traj),
             *COLLECT)
        t = TrajectoryStore.open(str(traj)).read_table().sort_by([("prompt_id", "ascending"),
                                                                   ("sample_index", "ascending")])
        out["trajectories"][split] = {c: t[c].to_pylist() for c in ("prompt_id", "sample_index",
                                                                     "response_token_ids", "reward",
                                                                     "behavior_logprobs")}
    for tag, (proj, rank) in PROJECTIONS.items():
        store = root / f"store-{tag}"
        for split in SPLITS:
            _cli("gradients", "--model", str(MODEL), "--trajectories", str(root / "traj" / split),
                 "--store", str(store), "--split", split, "--name", "golden", *proj)
        ranked = _cli("rank", "--store", str(store), "--name", "golden", "--pool", "pool",
                      "--validation", "val_a,val_b", "--top-fraction", "0.25", *rank)
        meta = ranked["meta"]
        gs = GradientStore(str(store))
        for split in SPLITS:
            g = gs.open_split("golden", meta["spec_id"], split).read()
            order = np.argsort(np.asarray(g.prompt_ids))
            vec = np.ascontiguousarray(g.vectors[order])
            status = [g.columns["status"][i] for i in order]
            ok = np.array([s == "ok" for s in status], dtype=bool)
            out["vectors"][f"{tag}/{split}"] = {
                "dtype": str(vec.dtype), "shape": list(vec.shape), "prompt_id": [g.prompt_ids[i] for i in order],
                "status": status, "raw_norm": [float(g.columns["raw_norm"][i]) for i in order],
                # float32's shortest decimal form: reads back to the same float32, half the digits of float64's
                "values": [[float(str(x)) for x in row] for row in vec[ok].astype(np.float32)],
                "zero_rows": bool(np.all(vec[~ok] == 0))}
        cols = ["prompt_id", "rank", "status", "fused", "score:val_a", "score:val_b", "selected"]
        out["rankings"][tag] = {"spec_id": meta["spec_id"], "selector": meta.get("selector"),
                                "excluded": meta["excluded"], "k": int(vec.shape[1]),
                                "rows": [{c: r[c] for c in cols} for r in ranked["rows"]]}
    return out


def capture_pinned(capability: str, root: Path, coretype: str = "native") -> dict | str:
    """The case run in a child process pinned to ``capability`` and ``coretype``: its capture, or, when the
    CPU cannot run them, a sentence saying what it needs."""
    # checked before the child starts: MKL's AVX512 branch on a CPU without AVX-512 dies of SIGILL
    if CAPABILITY_NEEDS[capability] - cpu_flags():
        return f"the golden case under {capability} needs a CPU with {NEEDS[capability]}"
    if CORE_NEEDS[coretype] - cpu_flags():
        return f"OpenBLAS kernels {coretype} need a CPU with {', '.join(sorted(CORE_NEEDS[coretype]))}"
    out = root / "capture.json"
    proc = subprocess.run([sys.executable, __file__, "--capture", str(out), capability],
                          env=pinned_env(capability, coretype), capture_output=True, text=True, timeout=900)
    if proc.returncode == NOT_AVAILABLE:
        return proc.stdout.strip()
    assert proc.returncode == 0, f"the golden case failed under {capability}/{coretype}:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def _required(var: str, known) -> set[str]:
    asked = {c for c in os.environ.get(var, "").split() if c}
    unknown = asked - set(known)
    assert not unknown, f"{var} names {sorted(unknown)}; known: {', '.join(known)}"
    return asked


def expected() -> dict:
    return json.loads((GOLDEN / "golden.json").read_text())["expected"]


@pytest.mark.parametrize("capability,coretype", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_cli_output_is_the_golden_case(capability, coretype, tmp_path):
    got = capture_pinned(capability, tmp_path, coretype)
    if isinstance(got, str):
        if capability in _required("CROPI_GOLDEN_CAPABILITIES", CAPABILITIES) and coretype == "native":
            pytest.fail(f"CROPI_GOLDEN_CAPABILITIES asks for {capability}, but {got}")
        if coretype in _required("CROPI_GOLDEN_CORETYPES", CORETYPES):
            pytest.fail(f"CROPI_GOLDEN_CORETYPES asks for {coretype}, but {got}")
        pytest.skip(got)
    problems = compare(got, expected())
    assert not problems, f"the golden case changed under {capability} / OpenBLAS {coretype}:\n" + "\n".join(problems)
    assert any(s == "ok" for v in got["vectors"].values() for s in v["status"]), "golden case has signal"


# The comparison itself, on the expected record: what a machine may change passes, what a refactor may not fails.

def _rescored(doc: dict, tag: str, transform=lambda v: v, cosine=None) -> dict:
    """``doc`` with ``tag``'s vectors passed through ``transform`` and its ranking's scores recomputed from
    them by brute force: v_j = mean of the set's ok vectors (every ok prompt: fewer than 100), score =
    cos(vector, v_j) in float64 (``cosine`` replaces that formula)."""
    doc = json.loads(json.dumps(doc))
    cosine = cosine or (lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    vecs = {}
    for split in SPLITS:
        entry = doc["vectors"][f"{tag}/{split}"]
        entry["values"] = transform(np.asarray(entry["values"], dtype=np.float32)).astype(np.float64).tolist()
        ok = [p for p, s in zip(entry["prompt_id"], entry["status"]) if s == "ok"]
        vecs[split] = dict(zip(ok, np.asarray(entry["values"])))
    targets = {s: np.mean(list(vecs[s].values()), axis=0) for s in ("val_a", "val_b")}
    for row in doc["rankings"][tag]["rows"]:
        if row["status"] == "ok":
            for s in ("val_a", "val_b"):
                row[f"score:{s}"] = cosine(vecs["pool"][row["prompt_id"]], targets[s])
    return doc


@pytest.mark.parametrize("tag", list(PROJECTIONS))
def test_the_expected_scores_are_the_brute_force_cosines_of_the_expected_vectors(tag):
    want = expected()
    assert not compare(_rescored(want, tag), want)


@pytest.mark.parametrize("tag", list(PROJECTIONS))
def test_a_one_ulp_change_of_the_vectors_passes(tag):
    want = expected()
    up = _rescored(want, tag, transform=lambda v: np.nextafter(v, np.float32(np.inf)))
    assert not compare(up, want)


def test_a_changed_formula_fails():
    """What a refactor may get wrong and the tolerances still catch: unnormalised scores, vectors scaled as a
    biased std would (sqrt(5/6) at K=6), one coordinate of every vector dropped, one token id changed."""
    want = expected()
    k = want["rankings"]["f32"]["k"]
    assert score_atol(k) < 1e-3
    dot = _rescored(want, "f32", cosine=lambda a, b: float(a @ b))
    assert any("score" in p for p in compare(dot, want))
    biased = _rescored(want, "f32", transform=lambda v: v * np.float32(np.sqrt(5 / 6)))
    assert any("vectors f32" in p for p in compare(biased, want))
    dropped = _rescored(want, "f32", transform=lambda v: np.where(np.arange(v.shape[-1]) == 0, 0, v))
    assert compare(dropped, want)
    token = json.loads(json.dumps(want))
    ids = token["trajectories"]["pool"]["response_token_ids"][0]
    ids[0] += 1
    assert compare(token, want) == ["trajectories pool: response_token_ids differs"]
    lp = json.loads(json.dumps(want))
    lp["trajectories"]["val_a"]["behavior_logprobs"][0][0] += 1e-2
    assert any("log-probabilities" in p for p in compare(lp, want))


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
    # python tests/test_golden.py --write "LABEL": the label names the code that ran. Captures every
    # capability this CPU runs and keeps the lowest's, after checking they agree within the tolerances.
    import tempfile

    caps = {}
    for cap in CAPABILITIES:
        with tempfile.TemporaryDirectory() as d:
            got = capture_pinned(cap, Path(d))
        if isinstance(got, str):
            print(f"skipped: {got}")
            continue
        caps[cap] = got
    first = next(iter(caps.values()))
    for cap, got in caps.items():
        problems = compare(got, first)
        if problems:
            sys.exit(f"capabilities disagree beyond the tolerances ({cap}):\n" + "\n".join(problems))
    doc = {"written_by": {"code": " ".join(sys.argv[2:]) or "the working tree", "capability": next(iter(caps)),
                          "agreed_with": sorted(caps)}, "expected": first}
    (GOLDEN / "golden.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
