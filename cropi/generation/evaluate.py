"""Accuracy of a policy on a prompt set: greedy, and sampled mean@k / pass@k.

Greedy accuracy alone moves in coarse jumps on a small test set and hides what RL
changes most (how often a sample is right), so both are read: ``mean@k`` is the
fraction of k samples at temperature 1 that are correct, averaged over prompts,
``pass@k`` the fraction of prompts with at least one correct sample.
Unscorable responses (the reward failed) count as wrong.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from cropi.data.records import PromptRecord
from cropi.generation.base import GenerationBackend, SamplingConfig
from cropi.rewards import score_responses


@dataclass(frozen=True)
class EvalSet:
    """Prompts rendered to token ids once, with their answers and a group label each."""

    name: str
    records: Sequence[PromptRecord]
    token_ids: Sequence[list[int]]

    @classmethod
    def build(cls, name: str, records: Sequence[PromptRecord], tokenizer) -> "EvalSet":
        from cropi.generation.prompting import render_prompt

        return cls(name, list(records), [render_prompt(tokenizer, r.prompt) for r in records])


def evaluate_policy(backend: GenerationBackend, data: EvalSet, reward_fn, *, samples: int = 4,
                    max_new_tokens: int = 16, seed: int = 0, group_key: str = "level") -> dict:
    """Greedy accuracy, sampled mean@k and pass@k (k = ``samples``, temperature 1) of ``data``.

    The sampled draws are seeded by ``seed`` and the prompt ids, so two policies are
    compared on the same random stream. ``by_group`` splits the three by
    ``extra_info[group_key]``.
    """
    keys = [r.prompt_id for r in data.records]
    greedy = backend.generate(list(data.token_ids), keys,
                              SamplingConfig(samples=1, temperature=0.0, max_new_tokens=max_new_tokens))
    sampled = backend.generate(list(data.token_ids), keys,
                               SamplingConfig(samples=samples, temperature=1.0, max_new_tokens=max_new_tokens,
                                              seed=seed)) if samples else [[] for _ in keys]
    rows = []
    for record, g, s in zip(data.records, greedy, sampled):
        right_g = _correct(reward_fn, [g[0].text], record.answer)[0]
        right_s = _correct(reward_fn, [x.text for x in s], record.answer)
        rows.append((str(record.extra_info.get(group_key, "all")), right_g, right_s))
    out = _summary(rows, samples)
    groups: dict[str, list] = defaultdict(list)
    for row in rows:
        groups[row[0]].append(row)
    out["by_group"] = {g: _summary(v, samples) for g, v in sorted(groups.items())}
    return out


def _correct(reward_fn, texts: list[str], answer: str) -> list[bool]:
    return [bool(r) for r in score_responses(reward_fn, texts, answer)]


def _summary(rows: list, samples: int) -> dict:
    n = len(rows)
    out = {"n": n, "greedy": sum(g for _, g, _ in rows) / n}
    if samples:
        out[f"mean@{samples}"] = sum(sum(s) / samples for _, _, s in rows) / n
        out[f"pass@{samples}"] = sum(any(s) for _, _, s in rows) / n
    return out
