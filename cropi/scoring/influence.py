"""Influence of pool prompts on a validation set: cosine to the mean validation gradient.

    v_j     = mean of P(g(s')) over a seeded sample of up to N ok prompts of V_j
    score_j = cos(P(g(s)), v_j)

Non-``ok`` prompts get NaN: they carry no usable signal and are never ranked. A validation set without
one ``ok`` prompt (``silent_sets``: typically every group's rewards equal, its targets all solved or all
failed by the behaviour policy, whose POPI gradient is exactly zero) adds a zero term to every pool
prompt's first-order influence on the objective, a sum over the sets: the ranking leaves it out and
says so, and refuses only when every set is silent.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from cropi.errors import InvalidInputError


NO_SIGNAL_HELP = ("use validation sets this checkpoint sometimes solves and sometimes fails, or draw more "
                  "samples per validation prompt (a group of K equal rewards has no gradient)")


def silent_sets(validation: Mapping[str, Sequence[str]]) -> dict[str, dict[str, int]]:
    """The validation sets (name -> their prompts' statuses) without one ``ok`` prompt, each with its
    prompts' status counts: their gradient is zero, so they add nothing to any prompt's influence."""
    return {name: {"prompts": len(status), **Counter(status)} for name, status in validation.items()
            if "ok" not in status}


def no_signal_error(silent: Mapping[str, Mapping[str, int]]) -> InvalidInputError:
    """The refusal when every validation set is silent: nothing can be ranked."""
    said = "; ".join(f"{name}: {counts.get('prompts', 0)} prompts, none ok ("
                     + ", ".join(f"{k} {v}" for k, v in counts.items() if k != "prompts") + ")"
                     for name, counts in silent.items())
    return InvalidInputError(f"no validation set carries a gradient, so every pool prompt's influence is zero "
                             f"and nothing can be ranked ({said}): {NO_SIGNAL_HELP}")


def validation_vector(prompt_ids, vectors: np.ndarray, status, *, max_prompts: int = 100,
                      seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Mean projected gradient of a seeded sample of the set's ``ok`` prompts."""
    ok = sorted((pid, i) for i, (pid, st) in enumerate(zip(prompt_ids, status)) if st == "ok")
    if not ok:
        raise InvalidInputError(
            f"validation set has no prompt with status 'ok' (all rewards equal or failed): {NO_SIGNAL_HELP}")
    rng = np.random.default_rng(seed)
    take = ok if len(ok) <= max_prompts else [ok[i] for i in sorted(rng.choice(len(ok), max_prompts, replace=False))]
    rows = np.array([i for _, i in take])
    mean = vectors[rows].astype(np.float32).mean(axis=0, dtype=np.float64).astype(np.float32)
    return mean, [pid for pid, _ in take]


def cosine_scores(vectors: np.ndarray, status, target: np.ndarray, *, chunk: int = 8192) -> np.ndarray:
    """Cosine of each row with ``target``; NaN where status is not ``ok`` or the row is zero."""
    target = np.asarray(target, dtype=np.float64)
    tnorm = np.linalg.norm(target)
    if not np.isfinite(tnorm) or tnorm == 0:
        raise InvalidInputError("validation vector is zero or non-finite: no prompt of that set carries signal")
    scores = np.empty(len(vectors), dtype=np.float64)
    for start in range(0, len(vectors), chunk):  # bounded float32 temporaries on big pools
        block = vectors[start:start + chunk].astype(np.float32)
        dots = block @ target.astype(np.float32)
        norms = np.linalg.norm(block, axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            scores[start:start + chunk] = dots / (norms * tnorm)
    ok = np.asarray(status) == "ok"
    scores[~ok | ~np.isfinite(scores)] = np.nan
    return scores
