"""Rewards by name: ``get_reward("math_verify")`` and the ``register_reward`` decorator.

A reward is ``fn(response_text, answer) -> float`` (1.0 correct, 0.0 not, for the
built-ins): a function of those two alone, as a verifiable reward is (a text drawn twice is
scored once: ``cropi.rewards.score_responses``). The built-ins register when
``cropi.rewards`` is imported.
"""

from __future__ import annotations

from typing import Callable, Protocol

from cropi.errors import InvalidInputError


class RewardFn(Protocol):
    def __call__(self, response_text: str, answer: str) -> float: ...


class UnknownRewardError(InvalidInputError):
    """No reward is registered under the requested name."""


_REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str, *, replace: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make ``fn`` available as ``get_reward(name)``.

    Registering a second function under a taken name is an error unless
    ``replace=True`` (re-registering the same function is harmless).
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(f"a reward name must be a non-empty string, got {name!r}")

    def deco(fn: RewardFn) -> RewardFn:
        if not callable(fn):
            raise InvalidInputError(f"reward {name!r} must be callable, got {type(fn).__name__}")
        old = _REWARDS.get(name)
        if old is not None and old is not fn and not replace:
            raise InvalidInputError(f"a reward named {name!r} is already registered; pick another name "
                                    "or pass replace=True")
        _REWARDS[name] = fn
        return fn

    return deco


def get_reward(name: str) -> RewardFn:
    """The reward registered under ``name``; ``UnknownRewardError`` lists the names there are."""
    try:
        return _REWARDS[name]
    except (KeyError, TypeError):
        raise UnknownRewardError(f"unknown reward {name!r}; available: {', '.join(available_rewards())}") from None


def available_rewards() -> list[str]:
    """Registered reward names, sorted."""
    return sorted(_REWARDS)
