"""A verl custom reward function backed by cropi's rewards.

verl's default reward picks a scorer by ``data_source`` and refuses names it
does not know (cropi's synthetic task uses ``arithmetic/<skill>/<level>``). Point
verl here instead::

    custom_reward_function.path=<site-packages>/cropi/rewards/verl_reward.py
    custom_reward_function.name=compute_score

The reward is the launcher's ``reward_name`` (passed through
``reward.custom_reward_function.reward_kwargs.reward_name``, which verl merges into
the call), else the row's ``extra_info.reward``, else ``math_verify``. verl needs a number for every response, so a reward that fails
or times out scores 0.0 here (verl's own math-verify scorer does the same).
"""

from __future__ import annotations

import logging

from cropi.rewards import get_reward, score_responses

log = logging.getLogger(__name__)

DEFAULT_REWARD = "math_verify"


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  reward_name: str | None = None, **kwargs) -> float:
    """verl's ``compute_score`` signature; 1.0 correct, 0.0 wrong or unscorable.

    An unknown ``reward_name`` raises rather than silently scoring everything 0.
    """
    name = reward_name or (extra_info or {}).get("reward") or DEFAULT_REWARD
    [score] = score_responses(get_reward(name), [solution_str], str(ground_truth))
    return 0.0 if score is None else score
