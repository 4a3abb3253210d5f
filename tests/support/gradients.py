"""A prompt's trajectories as the gradient computer takes them (a stand-in with the fields it reads)."""

from __future__ import annotations

from dataclasses import dataclass


VOCAB = 97


@dataclass
class Traj:
    prompt_id: str
    prompt_token_ids: list
    responses: list
    behavior_logprobs: list
    rewards: list
