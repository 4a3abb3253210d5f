"""The golden case's fixed inputs, the way it calls the `cropi` command (tests/test_golden.py;
test_factored.py runs the same command with the factored kind), and how a capture is compared with
the expected one on a machine that differs from the one that wrote it.

What decides float bits and is not the code: which vector kernels ATen dispatches to
(``ATEN_CPU_CAPABILITY``), which kernels numpy's OpenBLAS picks for the CPU model
(``OPENBLAS_CORETYPE``), thread counts, and the versions of torch / transformers / numpy. So the
comparison is exact only where the result is discrete, and within a tolerance derived from float32
arithmetic everywhere else:

- exact: token ids, sample indices, rewards, statuses, excluded counts, spec ids, which pool prompts
  are selected, and every vector of a prompt without signal (exactly zero by the mathematics);
- ``LOGPROB_ATOL`` for behavior log-probabilities; ``VECTOR_RTOL`` for projected vectors and raw
  norms (plus one float16 ulp where the store keeps float16);
- ``score_atol(k)`` for cosine scores;
- the order of the ranking exactly, except between two prompts whose scores on some validation set
  lie within that tolerance of each other (their order may legitimately flip; none do in this case).

Measured once on this case (avx2 against default against avx512 capture, 12489f8's code): scores
moved by at most 3.1e-7, raw norms by 1.2e-7 relative, behavior log-probabilities by under 1e-6.
A changed formula moves them by orders of magnitude more: tests/test_golden.py shows both sides.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from support.cli import run_cli as cli  # noqa: F401  (the golden case runs the command as every CLI test does)

HERE = Path(__file__).resolve().parents[1]
GOLDEN = HERE / "golden"
MODEL = GOLDEN / "model"  # the demo's shipped model at 12489f8, kept byte for byte as this case's input
COLLECT = ["--backend", "hf", "--samples", "6", "--max-new-tokens", "96", "--temperature", "0.7",
           "--reward", "exact_numeric", "--seed", "3"]


def store_through_cli(out: Path, *gradient_flags: str) -> Path:
    """The golden case's pool and ``val_a`` collected and their gradients stored under ``out/store`` (name
    ``g``) through the CLI, with ``gradient_flags`` added to the gradients job; returns the store."""
    for split in ("pool", "val_a"):
        cli("collect", "--model", str(MODEL), "--prompts", str(GOLDEN / f"{split}.jsonl"),
            "--out", str(out / split), *COLLECT)
        cli("gradients", "--model", str(MODEL), "--trajectories", str(out / split), "--store",
            str(out / "store"), "--split", split, "--name", "g", *gradient_flags)
    return out / "store"


def rank_through_cli(store: Path) -> dict:
    """``cropi rank`` over a store made by ``store_through_cli``: its top quarter of the pool for ``val_a``."""
    return cli("rank", "--store", str(store), "--name", "g", "--pool", "pool", "--validation", "val_a",
               "--top-fraction", "0.25")


EPS32 = float(np.finfo(np.float32).eps)
# A float32 forward of the tiny model (2 layers, width 64) sums a few hundred products per value: two
# summation orders differ by a few hundred eps32 relative to the summands, ~1e-5 of a log-probability of
# magnitude <= 20. 1e-4 leaves a 10x margin; a wrong temperature or a shifted token moves them by > 1e-2.
LOGPROB_ATOL = 1e-4
# Projected gradients: a float32 backward, then a projection summing thousands of products. Across
# kernels they agree to ~1e-6 of the vector's largest entry (measured 1.2e-7 on raw norms); 1e-4 is the
# bound. A biased std scales every vector of K=6 responses by sqrt(5/6) (9%), a dropped token by more.
VECTOR_RTOL = 1e-4


def score_atol(k: int) -> float:
    """How far a cosine of two length-``k`` float32 vectors may move between two summation orders of its
    float32 dot product (the BLAS kernel's choice): |delta dot| <= 2 k eps32 sum |a_i b_i| <= 2 k eps32 |a| |b|
    (Cauchy-Schwarz), so |delta cos| <= 2 k eps32; the norms and the division are float64, whose error is
    negligible beside it. 6.1e-5 at k=256, 9.8e-4 at k=4096; measured across capabilities: <= 1.6e-6."""
    return 2 * k * EPS32


def compare(got: dict, want: dict) -> list[str]:
    """What differs between two captures beyond the tolerances above (empty when they agree)."""
    problems: list[str] = []
    for split, w in want["trajectories"].items():
        problems += _trajectories(split, got["trajectories"].get(split), w)
    for key, w in want["vectors"].items():
        problems += _vectors(key, got["vectors"].get(key), w)
    for tag, w in want["rankings"].items():
        problems += _ranking(tag, got["rankings"].get(tag), w)
    return problems


def _trajectories(split: str, got: dict | None, want: dict) -> list[str]:
    if got is None:
        return [f"trajectories {split}: missing"]
    out = [f"trajectories {split}: {c} differs" for c in ("prompt_id", "sample_index", "response_token_ids",
                                                           "reward") if got[c] != want[c]]
    if out:
        return out
    worst = max((abs(a - b) for g, w in zip(got["behavior_logprobs"], want["behavior_logprobs"])
                 for a, b in zip(g, w)), default=0.0)
    if worst > LOGPROB_ATOL or any(len(g) != len(w) for g, w in zip(got["behavior_logprobs"],
                                                                      want["behavior_logprobs"])):
        out.append(f"trajectories {split}: behavior log-probabilities moved by {worst:.3g} > {LOGPROB_ATOL}")
    return out


def _vectors(key: str, got: dict | None, want: dict) -> list[str]:
    if got is None:
        return [f"vectors {key}: missing"]
    exact = [c for c in ("dtype", "shape", "prompt_id", "status") if got[c] != want[c]]
    if exact:
        return [f"vectors {key}: {', '.join(exact)} differ"]
    out = []
    if got["zero_rows"] != want["zero_rows"]:
        out.append(f"vectors {key}: rows without signal are not exactly zero ({got['zero_rows']})")
    g, w = np.asarray(got["values"], dtype=np.float64), np.asarray(want["values"], dtype=np.float64)
    if g.shape != w.shape:
        return out + [f"vectors {key}: {g.shape[0]} rows with signal, expected {w.shape[0]}"]
    if w.size:
        ulp16 = np.spacing(np.abs(w).astype(np.float16)).astype(np.float64) if want["dtype"] == "float16" else 0.0
        bound = VECTOR_RTOL * np.abs(w).max(axis=1, keepdims=True) + ulp16
        if np.any(np.abs(g - w) > bound):
            out.append(f"vectors {key}: moved by {np.max(np.abs(g - w) / np.maximum(bound, 1e-300)):.3g}x the "
                       "tolerance")
    rn_g, rn_w = np.asarray(got["raw_norm"]), np.asarray(want["raw_norm"])
    if np.any(np.abs(rn_g - rn_w) > VECTOR_RTOL * np.maximum(np.abs(rn_w), 1e-30)):
        out.append(f"vectors {key}: raw norms moved by more than {VECTOR_RTOL} relative")
    return out


SCORES = ("score:val_a", "score:val_b")


def _ranking(tag: str, got: dict | None, want: dict) -> list[str]:
    if got is None:
        return [f"ranking {tag}: missing"]
    out = [f"ranking {tag}: {c} differs ({got[c]} against {want[c]})" for c in ("spec_id", "selector", "excluded", "k")
           if got[c] != want[c]]
    g, w = {r["prompt_id"]: r for r in got["rows"]}, {r["prompt_id"]: r for r in want["rows"]}
    if set(g) != set(w):
        return out + [f"ranking {tag}: other prompts ranked"]
    tol = score_atol(want["k"])
    for pid, wr in w.items():
        gr = g[pid]
        if gr["status"] != wr["status"]:
            out.append(f"ranking {tag}: {pid} status {gr['status']} against {wr['status']}")
            continue
        for c in SCORES:
            if (gr[c] is None) != (wr[c] is None) or (wr[c] is not None and abs(gr[c] - wr[c]) > tol):
                out.append(f"ranking {tag}: {pid} {c} {gr[c]} against {wr[c]} (tolerance {tol:.2g})")
    if out:
        return out
    ranked = sorted((r for r in want["rows"] if r["rank"]), key=lambda r: r["rank"])
    if not any(abs(a[c] - b[c]) <= tol for a in ranked for b in ranked if a is not b for c in SCORES):
        # no near tie: every per-set rank is fixed, so the fused reciprocal-rank sums are too (to float64)
        out += [f"ranking {tag}: {r['prompt_id']} fused {g[r['prompt_id']]['fused']} against {r['fused']}"
                for r in ranked if abs(g[r["prompt_id"]]["fused"] - r["fused"]) > 1e-12]
    for a, b in zip(ranked, ranked[1:]):  # order fixed where neighbours' scores are resolvable
        near = any(abs(a[c] - b[c]) <= tol for c in SCORES)
        if not near and (g[a["prompt_id"]]["rank"], g[b["prompt_id"]]["rank"]) != (a["rank"], b["rank"]):
            out.append(f"ranking {tag}: {a['prompt_id']} and {b['prompt_id']} changed places")
    boundary_ties = any(any(abs(a[c] - b[c]) <= tol for c in SCORES) and a["selected"] != b["selected"]
                        for a, b in zip(ranked, ranked[1:]))
    if not boundary_ties and {p for p, r in g.items() if r["selected"]} != {p for p, r in w.items() if r["selected"]}:
        out.append(f"ranking {tag}: another set of prompts is selected")
    return out
