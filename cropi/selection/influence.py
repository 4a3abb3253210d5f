"""Selectors that read the influence ranking at theta_m: CROPI's rule and the two that
choose a subset for its joint effect (docs/method.md, "Selecting a subset").

``gain`` of a prompt is the mean of its per-validation-set cosines, ``<u_i, t>`` with ``u_i``
its unit projected gradient and ``t`` the mean of the unit validation directions: linear in
``u_i``, so a subset's summed update has the summed gain.
"""

from __future__ import annotations

import numpy as np

from cropi.errors import InvalidInputError
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
    least. O(n * rows * k): fine for pools up to about 10^5 prompts."""
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


# Multiply-adds the greedy may spend (picks x candidates x k): about 1-6 ns each on one CPU core
# (measured: 2,000 candidates x 500 picks x k=2,048 in 18 s on a loaded 2-core machine), so this is
# minutes. Past it the caller is told to lower the fraction or use CROPI's rule, rather than wait hours.
MAX_GREEDY_WORK = 5e11


def _diverse(inp: SelectionInputs, _: NoOptions) -> list[str]:
    g = gains(inp)
    ok = np.flatnonzero(np.isfinite(g))
    cand = np.flatnonzero(g[ok] > 0)
    work = min(inp.count, len(cand)) * len(cand) * np.shape(inp.vectors)[1]
    if work > MAX_GREEDY_WORK:
        raise InvalidInputError(
            f"selector 'diverse' would pick {min(inp.count, len(cand)):,} of {len(cand):,} candidates at k="
            f"{np.shape(inp.vectors)[1]:,} ({work:.1e} multiply-adds, over its bound of {MAX_GREEDY_WORK:.0e}: "
            "hours on a CPU); lower the selection fraction, project to a smaller k, or use selector 'cropi'")
    units = unit_rows(np.asarray(inp.vectors)[ok])
    c = mean_pairwise_cosine(units)  # what a random draw of the mixed (ok) prompts has
    picked = greedy_under_budget(units[cand], g[ok][cand], inp.count, c)
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
