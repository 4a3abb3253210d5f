"""The ``math_verify`` reward: Hugging Face's math-verify, used the way verl uses it.

Gold answers are held the way verl's math datasets hold ground truth (a bare
answer such as ``"1/2"``); like verl's ``reward_score/math_verify.py`` we wrap a
bare answer in ``\\boxed{}`` and parse it with LaTeX extraction, and parse the
response with expression then LaTeX extraction. 1.0 if any parsed form of the
response verifies against any parsed form of the gold, else 0.0.

Timeouts: math-verify's own are ``signal.alarm`` based and only work in the
main thread. They are used there, unless a ``cropi.rewards.deadline`` deadline
already guards the call; elsewhere they are off (a thread cannot be
interrupted) and the caller's deadline is what bounds the time.
"""

from __future__ import annotations

import functools
import logging

from cropi.errors import InvalidInputError
from cropi.rewards.deadline import RewardTimeoutError, deadline_active, in_main_thread
from cropi.rewards.registry import register_reward

PARSE_TIMEOUT_S = 5  # math-verify's defaults, per parse and per comparison
VERIFY_TIMEOUT_S = 5


class UnparseableAnswerError(InvalidInputError):
    """math-verify finds nothing to compare in a ground-truth answer."""


@register_reward("math_verify")
def math_verify_reward(response_text: str, answer: str) -> float:
    """1.0 if math-verify finds the response's final answer equal to ``answer``, else 0.0."""
    from math_verify.errors import TimeoutException

    timeouts = _own_timeouts()
    try:
        gold = _parse_gold(answer, timeouts)
        pred = _parse_response(response_text, timeouts)
        return 1.0 if any(_equal(g, p, timeouts) for g in gold for p in pred) else 0.0
    except TimeoutException as e:
        raise RewardTimeoutError(f"math-verify timed out: {e}") from None


def gold_latex(answer: str) -> str:
    """The gold answer as math-verify should see it: boxed unless already boxed or in $...$."""
    a = answer.strip()
    if "\\boxed" in a or (len(a) > 1 and a.startswith("$") and a.endswith("$")):
        return a
    return "\\boxed{" + a + "}"


def _own_timeouts() -> int | None:
    if deadline_active() or not in_main_thread():
        return None
    return PARSE_TIMEOUT_S


def _parse_gold(answer: str, timeouts: int | None) -> list:
    gold = _parse_gold_cached(answer, timeouts is not None)
    if not gold:
        raise UnparseableAnswerError(f"math-verify finds no answer in the ground truth {answer!r}; "
                                     "fix the answer, or use the exact_numeric reward for plain numbers")
    return gold


@functools.lru_cache(maxsize=8192)
def _parse_gold_cached(answer: str, timed: bool) -> list:
    from math_verify import LatexExtractionConfig, parse

    try:
        return parse(gold_latex(answer), [LatexExtractionConfig()],
                     parsing_timeout=PARSE_TIMEOUT_S if timed else None, raise_on_error=True)
    except Exception:
        return []  # the caller says the answer is unusable; timeouts propagate (not cached)


def _parse_response(text: str, timeouts: int | None) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    try:
        # raise_on_error so a timeout reaches us instead of reading as "no answer"
        return parse(text, [ExprExtractionConfig(), LatexExtractionConfig()],
                     parsing_timeout=timeouts, raise_on_error=True)
    except Exception:
        return []  # unparseable: no answer, which scores 0 (as math-verify's default does)


def _equal(gold, pred, timeouts: int | None) -> bool:
    from math_verify import verify

    # one pair at a time, so an error on one pair only fails that pair, as in math-verify's default
    try:
        return verify(gold, pred, timeout_seconds=VERIFY_TIMEOUT_S if timeouts else None, raise_on_error=True)
    except Exception:
        return False


class _DropTimeoutOffNotice(logging.Filter):
    # math-verify warns once that its timeouts are off; here that is deliberate (see module docstring)
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutOffNotice())
