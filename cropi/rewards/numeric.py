"""The ``exact_numeric`` reward: the response's final number against a numeric answer.

The final number is the content of the last ``\\boxed{...}`` when there is one,
else the last number in the text. Numbers may carry a sign, thousands commas
(``1,234``), decimals, or be fractions (``3/4``, ``\\frac{3}{4}``). Values are
compared exactly as rationals, within an absolute and relative tolerance of 1e-6.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

from cropi.errors import InvalidInputError
from cropi.rewards.registry import register_reward

ABS_TOL = Fraction(1, 10**6)
REL_TOL = Fraction(1, 10**6)

# A minus is a sign only where it cannot be subtraction (not right after a digit, letter or bracket).
_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?(?:/\d+)?")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_SPACING = re.compile(r"\\[,;:! ]|\\left|\\right|\$")


class NonNumericAnswerError(InvalidInputError):
    """``exact_numeric`` was given a ground-truth answer that is not one number."""


@register_reward("exact_numeric")
def exact_numeric_reward(response_text: str, answer: str) -> float:
    """1.0 if the response's final number equals the numeric ``answer`` (tolerance 1e-6), else 0.0."""
    gold = parse_number(answer)
    if gold is None:
        raise NonNumericAnswerError(f"exact_numeric needs a numeric answer, got {answer!r}; "
                                    "use the math_verify reward for symbolic answers")
    pred = final_number(response_text)
    if pred is None:
        return 0.0
    return 1.0 if abs(pred - gold) <= max(ABS_TOL, REL_TOL * abs(gold)) else 0.0


def final_number(text: str) -> Optional[Fraction]:
    """The last number in the last ``\\boxed{}`` if any, else the last number in ``text``."""
    boxed = last_boxed(text)
    return last_number(boxed if boxed is not None else text)


def parse_number(text: str) -> Optional[Fraction]:
    """``text`` as a number if it is exactly one (``"-1,234.5"``, ``"3/4"``, ``"\\frac{3}{4}"``), else None."""
    t = _normalize(text).strip()
    if t.startswith("+"):
        t = t[1:]
    m = _NUMBER.fullmatch(t)
    return _value(m.group(0)) if m else None


def last_number(text: str) -> Optional[Fraction]:
    """The value of the last number in ``text``, or None."""
    for m in reversed(list(_NUMBER.finditer(_normalize(text)))):
        value = _value(m.group(0))
        if value is not None:
            return value
    return None


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` (braces matched), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        content = _braced(text, start + len("\\boxed"))
        if content is not None:
            return content
        start = text.rfind("\\boxed", 0, start)
    return None


def _braced(text: str, i: int) -> Optional[str]:
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None  # unclosed


def _normalize(text: str) -> str:
    return _FRAC.sub(r"\1/\2", _SPACING.sub("", text))


def _value(token: str) -> Optional[Fraction]:
    try:
        return Fraction(token.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
