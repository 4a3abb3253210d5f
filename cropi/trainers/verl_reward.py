"""The reward function the verl launcher hands to verl (``reward.custom_reward_function``).

verl loads this file by path in its reward workers and calls ``compute_score``
for every response. The launcher passes the stage's reward name through
``reward.custom_reward_function.reward_kwargs.reward_name``, which verl merges
into the call; without it a row's ``extra_info.reward`` decides, else
``math_verify``. Scoring itself is ``cropi.rewards.verl_reward`` (a failing or
overlong reward scores 0.0, as verl needs a number for every response).
"""

from __future__ import annotations

from typing import Any, Optional

from cropi.rewards.verl_reward import compute_score as _score_with_cropi_reward

FUNCTION_NAME = "compute_score"


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Optional[dict] = None, reward_name: Optional[str] = None, **kwargs: Any) -> float:
    """verl's custom reward signature: 1.0 correct, 0.0 wrong or unscorable.

    ``reward_name`` (from the launcher's config) names a ``cropi.rewards`` reward
    for every row of the run; an unknown name raises ``UnknownRewardError``
    rather than silently scoring everything 0.
    """
    info = dict(extra_info or {})
    if reward_name is not None:
        info["reward"] = reward_name
    return _score_with_cropi_reward(data_source, solution_str, str(ground_truth), info)
