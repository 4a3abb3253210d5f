"""Test accuracy of a checkpoint: greedy decoding, batched, scored with a cropi reward."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Sequence

from cropi.data.records import PromptRecord
from cropi.generation import SamplingConfig, make_backend, render_prompt
from cropi.models import load_tokenizer
from cropi.rewards import get_reward, score_responses


def evaluate(model: str | Path, records: Sequence[PromptRecord], *, reward: str = "exact_numeric",
             max_new_tokens: int = 96, batch_rows: int = 128, group_key: str = "skill") -> dict:
    """Greedy accuracy of ``model`` on ``records``: overall and per ``extra_info[group_key]``.

    Unscorable responses (the reward failed) count as wrong.
    """
    tokenizer = load_tokenizer(model)
    prompts = [render_prompt(tokenizer, r.prompt) for r in records]
    greedy = SamplingConfig(samples=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=0)
    reward_fn = get_reward(reward)
    with make_backend("hf", str(model), max_batch_rows=batch_rows) as backend:
        outputs = backend.generate(prompts, [r.prompt_id for r in records], greedy)
    correct = [bool(score_responses(reward_fn, [s[0].text], r.answer)[0]) for s, r in zip(outputs, records)]
    groups: dict[str, list[bool]] = defaultdict(list)
    for ok, r in zip(correct, records):
        groups[str(r.extra_info.get(group_key, "all"))].append(ok)
    return {"accuracy": sum(correct) / len(correct), "n": len(correct),
            "by_group": {g: sum(v) / len(v) for g, v in sorted(groups.items())},
            "correct": {r.prompt_id: ok for r, ok in zip(records, correct)}}
