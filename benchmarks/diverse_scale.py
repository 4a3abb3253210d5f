"""`diverse` at pool sizes past the demo's: the exact greedy against the sampled one, side by side.

`diverse`'s exact greedy spends picks x candidates x k multiply-adds; past ``MAX_GREEDY_WORK`` the selector runs
the sampled greedy (``sampled_greedy_under_budget``). This measures both on the same inputs, in one process, in
turn: seconds, the picks' summed gain (what the greedy maximises) and their mean pairwise cosine (what its budget
bounds, against ``c``, a random draw's), and how many picks they share.

The inputs are real: theta_0's projected POPI gradients and validation directions of a finished demo run
(``--work``: its folder; the ranking's ok rows, the candidates those of positive gain). Past the demo's pool they
are grown from the real rows: each made row is a random convex combination of three real ok rows (Dirichlet
weights, so the rows keep the shared direction that makes a random draw's cosine ``c`` positive) plus isotropic
noise of norm ``NOISE``, unit-normed, its gain its cosine with the real target direction (the
least-norm ``t`` with ``U t = gain`` over the real rows, exact). Two regimes per size: the base fraction (picks
0.55 of the candidates, the demo's 120 of 212 at theta_0 on `lists`) and a widened one (every candidate ordered).
The exact greedy runs up to ``--exact-max`` candidates; the sampled one at every size.

    python benchmarks/diverse_scale.py --work out/demo [--source TEXT] [--sizes 1000,3000,6000,30000,100000] \
        [--exact-max 6000] --out benchmarks/results
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, write_json  # noqa: E402

BASE_SHARE = 0.55  # picks over candidates at the base fraction (lists at theta_0: 120 of 212)
NOISE = 0.3  # the made rows' isotropic noise, in norm (a convex mix of three unit rows has norm 0.6-1)


def real_rows(work: Path, curriculum: str) -> tuple[np.ndarray, np.ndarray]:
    """theta_0's ok pool rows (unit) and their gains, as the demo's stage 0 ranked them."""
    from cropi.contracts import POOL
    from cropi.pipeline.curriculum.state import load_state
    from cropi.scoring import rank_pool
    from cropi.selection import SelectionInputs
    from cropi.selection.influence import gains, unit_rows
    from cropi.store import GradientStore

    runs = work / "runs"
    doc = load_state(runs, curriculum)
    scored = doc["stages"][0]["scored"]
    store = GradientStore(str(runs / "store"))
    name, spec = scored["checkpoint"], scored["spec_id"]
    pool = store.open_split(name, spec, POOL).read()
    val = {}
    for v in doc["config"]["validation"]:
        t = store.open_split(name, spec, v).read()
        val[v] = (t.prompt_ids, t.vectors, list(t.columns["status"]))
    ranking = rank_pool(pool.prompt_ids, pool.vectors, list(pool.columns["status"]), val)
    g = gains(SelectionInputs(prompt_ids=pool.prompt_ids, fraction=0.1, ranking=ranking, vectors=pool.vectors))
    ok = np.flatnonzero(np.isfinite(g))
    return unit_rows(np.asarray(pool.vectors)[ok]), g[ok]


def grown_rows(units: np.ndarray, gain: np.ndarray, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    from cropi.selection.influence import unit_rows

    target = np.linalg.lstsq(units, gain, rcond=None)[0]
    k = units.shape[1]
    out = np.empty((rows, k))
    for start in range(0, rows, 4096):  # in blocks: the made rows' draws stay a few hundred MB
        b = min(4096, rows - start)
        mix = np.einsum("rj,rjk->rk", rng.dirichlet(np.ones(3), size=b), units[rng.integers(0, len(units), (b, 3))])
        out[start:start + b] = mix + NOISE * rng.normal(size=(b, k)) / math.sqrt(k)
    out = unit_rows(out)
    return out, out @ target


def compare(units: np.ndarray, gain: np.ndarray, share: float, exact: bool, seed: int) -> dict:
    from cropi.selection.influence import greedy_under_budget, mean_pairwise_cosine, sampled_greedy_under_budget

    c = mean_pairwise_cosine(units)
    cand = np.flatnonzero(gain > 0)
    u, g = units[cand], gain[cand]
    n = max(1, round(share * len(cand)))
    row = {"ok_rows": len(units), "candidates": len(cand), "picks": n, "k": units.shape[1], "c_random_draw": c,
           "exact_work_multiply_adds": float(n) * len(cand) * units.shape[1]}
    runs = {}
    if exact:
        began = time.perf_counter()
        runs["exact"] = greedy_under_budget(u, g, n, c)
        row["exact_s"] = time.perf_counter() - began
    began = time.perf_counter()
    runs["sampled"] = sampled_greedy_under_budget(u, g, n, c, np.random.default_rng(seed))
    row["sampled_s"] = time.perf_counter() - began
    for side, picked in runs.items():
        row[f"{side}_gain_sum"] = float(g[picked].sum())
        row[f"{side}_pairwise_cosine"] = mean_pairwise_cosine(u[picked])
    if exact:
        row["sampled_over_exact_gain"] = row["sampled_gain_sum"] / row["exact_gain_sum"]
        row["shared_picks"] = len(set(runs["exact"]) & set(runs["sampled"])) / n
        row["exact_ns_per_multiply_add"] = 1e9 * row["exact_s"] / row["exact_work_multiply_adds"]
        row["exact_over_sampled_s"] = row["exact_s"] / row["sampled_s"]
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="a finished `cropi demo` folder")
    ap.add_argument("--source", default=None, help="what --work was, for the record (default: its name)")
    ap.add_argument("--curriculum", default="diverse-seed0")
    ap.add_argument("--sizes", default="1000,3000,6000,30000,100000", help="ok rows of the grown pools")
    ap.add_argument("--exact-max", type=int, default=6000, help="the most ok rows the exact greedy runs at")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    a = ap.parse_args(argv)
    from cropi.models.warmstart import set_threads
    from cropi.selection.influence import MAX_GREEDY_WORK

    set_threads(1)
    units, gain = real_rows(a.work, a.curriculum)
    rng = np.random.default_rng(a.seed)
    rows = []
    pools = [("real", units, gain)] + [("grown", *grown_rows(units, gain, int(s), rng)) for s in a.sizes.split(",")]
    for kind, u, g in pools:
        for regime, share in (("base", BASE_SHARE), ("widened", 1.0)):
            row = {"pool": kind, "regime": regime} | compare(u, g, share, len(u) <= a.exact_max, a.seed)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            rows.append(row)
    result = {"command": "python benchmarks/diverse_scale.py --work DIR " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in (("sizes", a.sizes), ("exact_max", a.exact_max))),
              "source": a.source or a.work.name, "curriculum": a.curriculum, "max_greedy_work": MAX_GREEDY_WORK,
              "miss": 0.01, "rows": rows, "environment": environment()}
    write_json(a.out, "diverse_scale.json", result)
    return result


if __name__ == "__main__":
    main()
