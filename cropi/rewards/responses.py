"""Score a prompt's responses with a reward, never letting one bad response stop the job."""

from __future__ import annotations

import logging
import math
import numbers

from cropi.rewards.deadline import call_with_deadline
from cropi.rewards.registry import RewardFn

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0


def score_responses(fn: RewardFn, texts: list[str], answer: str, *,
                    timeout_s: float | None = DEFAULT_TIMEOUT_S) -> list[float | None]:
    """``fn(text, answer)`` for each response; None (and a warning) where it fails.

    A reward that raises, runs past ``timeout_s`` seconds, or returns something
    that is not a finite number marks that response None; the others are scored
    as usual. Works from any thread (see ``cropi.rewards.deadline``).

    A reward is a function of the response's text and the answer (``RewardFn``), so a text
    drawn more than once is scored once and every copy gets that score: short answers
    sampled at a low temperature repeat (in the lists demo's offline trajectories a group of
    8 holds 3.6 distinct texts on average), and a slow or failing reward then costs its
    timeout or warning once.
    """
    scored: dict[str, float | None] = {}
    for k, text in enumerate(texts):
        if text not in scored:
            scored[text] = _one(fn, text, answer, k, timeout_s)
    return [scored[text] for text in texts]


def _one(fn: RewardFn, text: str, answer: str, k: int, timeout_s: float | None) -> float | None:
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        value = call_with_deadline(fn, (text, answer), timeout_s)
    except Exception as e:
        log.warning("reward %s failed on response %d (answer %r): %s: %s; scored None",
                    name, k, answer, type(e).__name__, e)
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        log.warning("reward %s returned %r for response %d, not a finite number; scored None", name, value, k)
        return None
    return float(value)
