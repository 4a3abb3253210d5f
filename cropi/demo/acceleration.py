"""Acceleration: how much sooner a method reaches a share of full-pool training's gain.

For one seed, with test accuracy read at evaluations along both runs (x = training steps,
or seconds with the method's scoring counted)::

    start        = full-pool accuracy at x = 0 (every method starts from the same model)
    final        = full-pool accuracy at the end: the mean of its last ``FINAL_POINTS`` evaluations
    target(q)    = start + q * (final - start)              q = 0.5, 0.75, 0.9 (the headline)
    full_x       = first evaluated x at which full-pool training reaches target(q)
    method_x     = first evaluated x at which the method reaches it
    acceleration = full_x / method_x

A share below 1 of full's own gain keeps a plateau from deciding the figure: when every
method levels off near the same accuracy, "first step at full's final accuracy" is
decided by noise around the plateau, while the step at which 90% of the gain is in hand
is not. CROPI (Zhu et al.) reports 2.66x (to full's final accuracy) on Qwen2.5-1.5B. When
the method never reaches the target within its run, the value is ``full_x / last_x`` with
``censored: true``: an upper bound. It is undefined (None, with a reason) only when
full-pool training gained nothing.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from cropi.errors import InvalidInputError

EPS = 1e-12  # accuracies are fractions of one test set: equal values compare equal
FINAL_POINTS = 3
HEADLINE = 0.9
SHARES = (0.5, 0.75, 0.9)


def first_reaching(xs: Sequence[float], accuracy: Sequence[float], target: float) -> Optional[float]:
    """The first evaluated x whose accuracy is at least ``target``, or None."""
    for x, acc in zip(xs, accuracy):
        if acc >= target - EPS:
            return x
    return None


def _check(name: str, xs: Sequence[float], ys: Sequence[float]) -> None:
    if len(xs) != len(ys) or not xs:
        raise InvalidInputError(f"{name}: need one accuracy per evaluation, got {len(xs)} points and {len(ys)} "
                                "accuracies")
    if list(xs) != sorted(xs) or xs[0] != 0:
        raise InvalidInputError(f"{name}: evaluations must start at 0 and increase, got {list(xs)[:5]}...")


def acceleration(full_x: Sequence[float], full: Sequence[float], x: Sequence[float], method: Sequence[float],
                 share: float = HEADLINE) -> dict:
    """One seed's acceleration at ``share`` of full's gain: ``{"value", "target", "full_x", "method_x",
    "censored", "reason"}``."""
    _check("full-pool run", full_x, full)
    _check("method's run", x, method)
    if not 0 < share <= 1:
        raise InvalidInputError(f"share of the gain must be in (0, 1], got {share}")
    final = sum(full[-FINAL_POINTS:]) / len(full[-FINAL_POINTS:])
    target = full[0] + share * (final - full[0])
    out = {"value": None, "target": target, "full_x": None, "method_x": None, "censored": False, "reason": None}
    if final - full[0] <= EPS:
        out["reason"] = (f"full-pool training never rose above its starting accuracy {full[0]:.4f} (final "
                         f"{final:.4f}): there is no gain to reach sooner")
        return out
    out["full_x"], out["method_x"] = first_reaching(full_x, full, target), first_reaching(x, method, target)
    if out["method_x"] is None:
        out["reason"] = (f"never reached {target:.4f} ({share:.0%} of full-pool's gain) within {x[-1]:g} (its best: "
                         f"{max(method):.4f}): the value is an upper bound")
        out["value"], out["censored"] = out["full_x"] / x[-1], True
    elif out["method_x"] == 0:
        out["reason"] = "the method starts at or above the target (runs must share their starting model)"
    else:
        out["value"] = out["full_x"] / out["method_x"]
    return out


def area_under_curve(xs: Sequence[float], accuracy: Sequence[float]) -> float:
    """Mean accuracy over the run: the trapezoid area under the curve divided by its length."""
    _check("run", xs, accuracy)
    if len(xs) == 1:
        return float(accuracy[0])
    area = sum((xs[i + 1] - xs[i]) * (accuracy[i] + accuracy[i + 1]) / 2 for i in range(len(xs) - 1))
    return area / (xs[-1] - xs[0])


def aggregate(per_seed: dict[str, dict]) -> dict:
    """Mean, sample standard deviation, min and max of the defined per-seed values."""
    values = [r["value"] for r in per_seed.values() if r["value"] is not None]
    undefined = {seed: r["reason"] for seed, r in per_seed.items() if r["value"] is None}
    censored = sorted(seed for seed, r in per_seed.items() if r.get("censored"))
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0, "undefined": undefined,
                "censored": censored}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values),
            "undefined": undefined, "censored": censored}
