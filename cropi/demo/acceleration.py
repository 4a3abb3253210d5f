"""Step acceleration: how much sooner CROPI reaches full-pool training's final accuracy.

For one seed, with test accuracy evaluated at the same training steps for both runs::

    target       = full-pool accuracy at the end: the mean of its last ``FINAL_POINTS`` evaluations
    full_steps   = first evaluated step at which full-pool training reaches target
    cropi_steps  = first evaluated step at which CROPI reaches target
    acceleration = full_steps / cropi_steps

CROPI (Zhu et al.) reports 2.66 on Qwen2.5-1.5B. Accuracies are known at the
evaluated steps (every few steps), so the steps are those of the first evaluation
at or above the target; averaging the last evaluations keeps one lucky reading
from setting the bar. When CROPI never reaches the target within the run, the
value is ``full_steps / last_step`` with ``censored: true``: an upper bound (CROPI
would need more steps than were run). The ratio is undefined (None, with a
reason) only when full-pool training never rose above its step-0 accuracy.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from cropi.errors import InvalidInputError

EPS = 1e-12  # accuracies are fractions of one test set: equal values compare equal
FINAL_POINTS = 3


def first_step_reaching(steps: Sequence[int], accuracy: Sequence[float], target: float) -> Optional[int]:
    """The first evaluated step whose accuracy is at least ``target``, or None."""
    for step, acc in zip(steps, accuracy):
        if acc >= target - EPS:
            return step
    return None


def step_acceleration(steps: Sequence[int], full: Sequence[float], cropi: Sequence[float]) -> dict:
    """One seed's acceleration: ``{"value", "target", "full_steps", "cropi_steps", "reason"}``."""
    if not (len(steps) == len(full) == len(cropi)) or not steps:
        raise InvalidInputError(f"need one accuracy per evaluated step for both runs, got {len(steps)} steps, "
                                f"{len(full)} full-pool and {len(cropi)} CROPI accuracies")
    if list(steps) != sorted(steps):
        raise InvalidInputError(f"evaluated steps must be increasing, got {list(steps)}")
    target = sum(full[-FINAL_POINTS:]) / len(full[-FINAL_POINTS:])
    full_steps = first_step_reaching(steps, full, target)
    cropi_steps = first_step_reaching(steps, cropi, target)
    out = {"value": None, "target": target, "full_steps": full_steps, "cropi_steps": cropi_steps, "reason": None,
           "censored": False}
    if full_steps == steps[0]:
        out["reason"] = (f"full-pool training never rose above its step-{steps[0]} accuracy {target:.4f}: "
                         "there is no gain to reach sooner")
    elif cropi_steps == 0:
        out["reason"] = "CROPI's run starts at or above the target (the two runs must share their step-0 model)"
    elif cropi_steps is None:
        out["reason"] = (f"CROPI never reached full-pool's final accuracy {target:.4f} within {steps[-1]} steps "
                         f"(its best: {max(cropi):.4f}): the value is an upper bound")
        out["value"], out["censored"] = full_steps / steps[-1], True
    else:
        out["value"] = full_steps / cropi_steps
    return out


def aggregate(per_seed: dict[str, dict]) -> dict:
    """Mean, sample standard deviation, min and max of the defined per-seed values."""
    values = [r["value"] for r in per_seed.values() if r["value"] is not None]
    undefined = {seed: r["reason"] for seed, r in per_seed.items() if r["value"] is None}
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0, "undefined": undefined}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values),
            "undefined": undefined}
