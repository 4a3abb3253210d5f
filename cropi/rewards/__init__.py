"""Verifiable rewards by name, and scoring that survives a failing reward.

Built-ins: ``math_verify`` (math-verify equivalence, verl's way) and
``exact_numeric`` (final number against a numeric answer).
"""

from cropi.rewards import mathverify as _mathverify  # noqa: F401  (registers math_verify)
from cropi.rewards import numeric as _numeric  # noqa: F401  (registers exact_numeric)
from cropi.rewards.deadline import RewardTimeoutError, call_with_deadline
from cropi.rewards.mathverify import UnparseableAnswerError, math_verify_reward
from cropi.rewards.numeric import NonNumericAnswerError, exact_numeric_reward
from cropi.rewards.registry import RewardFn, UnknownRewardError, available_rewards, get_reward, register_reward
from cropi.rewards.responses import score_responses

__all__ = ["RewardFn", "get_reward", "register_reward", "available_rewards", "score_responses",
           "math_verify_reward", "exact_numeric_reward", "call_with_deadline", "RewardTimeoutError",
           "UnknownRewardError", "UnparseableAnswerError", "NonNumericAnswerError"]
