"""How often the check's screen reverts when nothing changed: the normal margin against Student's t.

    python benchmarks/check_null_rate.py --out benchmarks/results/demo/check_null_rate.json

Two readings of checkpoints that do not differ: per prompt a pass rate uniform in 0.05-0.95, ``k = 4`` draws at
each checkpoint, ``n`` prompts in each of ``J`` sets; the screen's statistic is the paired change of the mean over
sets over its SE (cropi.pipeline.curriculum.check.paired_change), one-sided at the level 0.05 over 4 checks. The
share of nulls that revert is the test's real rate; the check states 0.0125. Vectorised here (not through
``judge``, whose agreement with scipy's t-tests tests/test_check.py checks), 40,000 nulls a row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import stats

LEVEL = 0.05 / 4
ROWS = ((5, 1), (8, 1), (21, 1), (21, 2), (39, 2))  # (prompts a set, sets): the demo's plans are 21 and 39


def rates(nulls: int = 40_000, k: int = 4, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    z = stats.norm.ppf(1 - LEVEL)
    out = []
    for n, sets in ROWS:
        p = rng.uniform(0.05, 0.95, size=(nulls, sets, n))
        d = rng.binomial(k, p) / k - rng.binomial(k, p) / k
        u = d.var(axis=2, ddof=1) / n  # per set: the variance of its mean change
        with np.errstate(divide="ignore", invalid="ignore"):  # a null whose changes are all equal: SE 0
            ratio = d.mean(axis=2).mean(axis=1) / (np.sqrt(u.sum(axis=1)) / sets)
            welch = u.sum(axis=1) ** 2 / ((u ** 2).sum(axis=1) / (n - 1))
            t = stats.t.ppf(1 - LEVEL, welch)
            out.append({"prompts": n, "sets": sets, "stated": LEVEL, "normal": float(np.mean(ratio < -z)),
                        "t_welch": float(np.mean(ratio < -t)), "nulls": nulls})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    doc = {"command": "python benchmarks/check_null_rate.py", "k": 4, "level": LEVEL, "rows": rates()}
    text = json.dumps(doc, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
