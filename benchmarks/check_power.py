"""What the check's reversal rule delivers against what it states: its power against a fall of ``resolve`` and its
chance of a fallback a stage when nothing changed, for the screen's two levels (``check.screen``).

    python benchmarks/check_power.py --out benchmarks/results/demo                ->  OUT/check_power.json

A reversal needs the screen (the part against the best on the check's sample) and its confirmation (both read
again on held-out prompts and a fresh stream), each a paired t-test through ``cropi.pipeline.curriculum.check.judge``.
The plan sizes the sample so that *one* test at ``alpha / C`` has power ``power``; revisions 3-12 ask both at that
level, so the rule's power is about the product. The confirmation is independent of the screen's selection, so
the union bound over the stage's ``C`` confirmations holds the fallback's rate under ``alpha`` at any screen level;
``alpha`` screens at ``alpha`` itself (a gate for the confirmation's cost), ``split`` at ``alpha / C`` (revisions 3-12). Per prompt a pass rate uniform in
the row's range, ``k`` draws a reading, ``J = 2`` sets of the plan's ``n`` prompts (``sample_size``) at the check's
defaults; a fall moves every prompt down by ``resolve``; a plateau reads one model ``C + 1`` times, screened against
the best so far (the winner's curse, as in tests/test_check.py). No common random numbers: the worst case.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from common import emit

from cropi.pipeline.curriculum import check as chk

RANGES = ((0.1, 0.9), (0.3, 0.7), (0.02, 0.3))
SETS = 2


def measure(lo: float, hi: float, trials: int, rng: np.random.Generator) -> dict:
    opts = chk.CheckOptions()
    parts, k, delta = opts.parts, opts.samples, opts.resolve
    p = rng.uniform(lo, hi, size=(SETS, 10_000))
    v = max(float(np.mean(p * (1 - p))), delta * (1 - delta))
    n = chk.sample_size(v, opts, SETS, parts)
    checked, held_out = p[:, :n], p[:, n:2 * n]

    def read(rates, fall=0.0):
        return {f"s{j}": rng.binomial(k, np.clip(rates[j] - fall, 0, 1)) / k for j in range(SETS)}

    split = chk.reversal_z(opts, parts)
    out = {"pass_rates": [lo, hi], "variance": round(v, 4), "prompts_a_set": n, "sets": SETS, "samples": k,
           "stated": {"power": opts.power, "alpha": opts.alpha}}
    for screen in ("split", "alpha"):
        level = split if screen == "split" else chk.z_value(1 - opts.alpha)
        fired = fell = 0
        for _ in range(trials):  # a real fall of resolve against an unbiased best
            if chk.judge(read(checked, delta), read(checked), level, "t").action == "reverted":
                fired += 1
                fell += chk.judge(read(held_out, delta), read(held_out), split, "t").action == "reverted"
        alarms = screens = 0
        for _ in range(trials):  # a plateau: nothing changes, the best is the highest reading so far
            best = read(checked)
            for _ in range(parts):
                now = read(checked)
                if chk.judge(now, best, level, "t").action == "reverted":
                    screens += 1
                    if chk.judge(read(held_out), read(held_out), split, "t").action == "reverted":
                        alarms += 1
                        break
                if chk.objective(now) > chk.objective(best):
                    best = now
        out[screen] = {"screen_fires_on_a_fall": fired / trials, "power": fell / trials,
                       "fallbacks_a_stage_on_a_plateau": alarms / trials,
                       "confirmations_a_stage_on_a_plateau": screens / trials}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="folder for check_power.json")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    result = {"definition": __doc__.split("\n\n")[2].replace("\n", " "), "trials": a.trials,
              "rows": [measure(lo, hi, a.trials, rng) for lo, hi in RANGES]}
    return emit(a.out, "check_power.json", result, "rows")


if __name__ == "__main__":
    main()
