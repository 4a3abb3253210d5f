"""Selectors that read the influence ranking at theta_m: CROPI's rule and the two that
choose a subset for its joint effect (docs/method.md, "Selecting a subset").

``gain`` of a prompt is the mean of its per-validation-set cosines, ``<u_i, t>`` with ``u_i``
its unit projected gradient and ``t`` the mean of the unit validation directions: linear in
``u_i``, so a subset's summed update has the summed gain.
"""

from __future__ import annotations

import math

import numpy as np

from cropi.scoring.selection import select_top
from cropi.selection.base import NoOptions, SelectionInputs, Selector, register


def gains(inp: SelectionInputs) -> np.ndarray:
    """Per ranking row: the mean cosine over the validation sets (NaN where not ``ok``)."""
    r = inp.ranking
    mean = np.mean(np.stack([np.asarray(s, dtype=np.float64) for s in r.scores.values()]), axis=0)
    return np.where(np.asarray(r.status) == "ok", mean, np.nan)


def _cropi(inp: SelectionInputs, _: NoOptions) -> list[str]:
    r = inp.ranking
    return select_top(r.prompt_ids, r.fused, r.status, top_k=inp.count)


def _positive(inp: SelectionInputs, _: NoOptions) -> list[str]:
    g = gains(inp)
    ids = sorted(p for p, v in zip(inp.ranking.prompt_ids, g) if v > 0)
    return inp.rng("positive").sample(ids, min(len(ids), inp.count))


def mean_pairwise_cosine(units: np.ndarray) -> float:
    """Mean cosine over the distinct pairs of unit rows, from their sum: ``(|sum u|^2 - N) / (N (N - 1))``.

    Exactly the mean pairwise cosine a uniform random draw of these rows has in expectation."""
    n = len(units)
    if n < 2:
        return 0.0
    s = units.sum(axis=0)
    return float((s @ s - n) / (n * (n - 1)))


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    v = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)


def greedy_under_budget(units: np.ndarray, gain: np.ndarray, n: int, c: float) -> list[int]:
    """Indices in pick order: each step adds, among the rows that keep ``|sum u|^2 <= t + t (t-1) c`` at
    the new size ``t``, the one with the largest gain; when none fits, the one raising ``|sum u|^2``
    least. O(n * rows * k): past ``MAX_GREEDY_WORK``, ``sampled_greedy_under_budget``."""
    taken = np.zeros(len(units), dtype=bool)
    dots = np.zeros(len(units))  # <sum of picked, u_i>
    total, picked = 0.0, []
    for t in range(1, min(n, len(units)) + 1):
        grown = total + 2.0 * dots + 1.0  # |sum u|^2 after adding each row
        budget = t + t * (t - 1) * max(c, 0.0)
        fits = ~taken & (grown <= budget + 1e-9)
        if fits.any():
            j = int(np.flatnonzero(fits)[np.argmax(gain[fits])])
        else:
            free = np.flatnonzero(~taken)
            j = int(free[np.argmin(grown[free])])
        taken[j], total = True, float(grown[j])
        dots += units @ units[j]
        picked.append(j)
    return picked


def sampled_greedy_under_budget(units: np.ndarray, gain: np.ndarray, n: int, c: float, rng: np.random.Generator,
                                miss: float = 0.01) -> list[int]:
    """``greedy_under_budget`` with each step's search over a uniform sample of ``s = ceil(R / n * ln(1 / miss))``
    of the ``R`` rows instead of all of them (the stochastic greedy of Mirzasoleiman et al., "Lazier than lazy
    greedy", AAAI 2015). Where at least ``n`` free rows fit, a step's sample misses all ``n`` best of them with
    probability at most ``(1 - n / R)^s <= miss``: each pick is, with probability at least ``1 - miss``, among the
    rows the exact greedy could still take into a subset of this size. Where none of the sample fits, the sample's
    least-growing row (the exact greedy's over every free row). O(R k ln(1 / miss)) in all, against O(n R k)."""
    rows_n, n = len(units), min(n, len(units))
    s = max(1, math.ceil(rows_n / max(n, 1) * math.log(1 / miss)))
    free = np.arange(rows_n)
    total, sums, picked = 0.0, np.zeros(units.shape[1], dtype=units.dtype), []
    for t in range(1, n + 1):
        left = len(free)
        at = np.arange(left) if left <= s else np.unique(rng.integers(0, left, s))
        rows = free[at]
        grown = total + 2.0 * (units[rows] @ sums) + 1.0
        budget = t + t * (t - 1) * max(c, 0.0)
        fits = grown <= budget + 1e-9
        k = int(np.flatnonzero(fits)[np.argmax(gain[rows][fits])]) if fits.any() else int(np.argmin(grown))
        j = int(rows[k])
        total = float(grown[k])
        sums += units[j]
        picked.append(j)
        free[at[k]] = free[left - 1]  # the picked row leaves the free rows (the last takes its place)
        free = free[:left - 1]
    return picked


# Multiply-adds the exact greedy may spend (picks x candidates x k): 0.2-0.7 ns each on one idle core of an Intel
# Xeon (benchmarks/results/diverse_scale.json: 7,782 candidates x 4,280 picks x k=4,096 in 43 s), 1-6 ns on a loaded
# 2-core machine, so this is minutes. Past it the sampled greedy runs: 108-191x faster at that size, its picks' gain
# 1.03x the exact greedy's and their pairwise cosine 10% higher. The bound stays where revisions before measured
# the exact path, so every pool it took before takes it still.
MAX_GREEDY_WORK = 5e11


def _diverse(inp: SelectionInputs, _: NoOptions) -> list[str]:
    g = gains(inp)
    ok = np.flatnonzero(np.isfinite(g))
    cand = np.flatnonzero(g[ok] > 0)
    units = unit_rows(np.asarray(inp.vectors)[ok])
    c = mean_pairwise_cosine(units)  # what a random draw of the mixed (ok) prompts has
    if min(inp.count, len(cand)) * len(cand) * units.shape[1] <= MAX_GREEDY_WORK:
        picked = greedy_under_budget(units[cand], g[ok][cand], inp.count, c)
    else:  # its own stream, salted as every selector's draw is (fresh at every stage)
        stream = np.random.default_rng(inp.rng("diverse").getrandbits(64))
        picked = sampled_greedy_under_budget(units[cand], g[ok][cand], inp.count, c, stream)
    return [inp.ranking.prompt_ids[ok[cand[j]]] for j in picked]


CROPI = register(Selector("cropi", _cropi, "CROPI's rule: the top fraction of the pool by fused influence score",
                          needs=("ranking",)))
POSITIVE = register(Selector(
    "positive", _positive, "a random fraction of the ok prompts whose mean cosine with the targets is positive, "
    "afresh every stage: informative's spread without the first-order harmful prompts", needs=("ranking",)))
DIVERSE = register(Selector(
    "diverse", _diverse, "greedy: the most target-aligned ok prompts whose summed unit gradient stays no more "
    "concentrated than a random draw of the mixed prompts (AdamW's step then stays the one its lr was tuned for)",
    needs=("ranking", "vectors")))
