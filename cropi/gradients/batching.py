"""Pack responses into left-padded micro-batches under a token budget (one prompt's, or many prompts').

Left padding puts every response at the end of its row, so the model only has to
produce logits for the last ``max_response_len + 1`` positions (``logits_to_keep``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MicroBatch:
    indices: list[int]              # which responses of the group
    input_ids: torch.Tensor         # (B, T) left padded prompt + response
    attention_mask: torch.Tensor    # (B, T)
    position_ids: torch.Tensor      # (B, T)
    targets: torch.Tensor           # (B, L) response tokens, right-aligned
    response_mask: torch.Tensor     # (B, L) 1 on real response tokens
    behavior_logp: torch.Tensor     # (B, L) aligned with targets

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group response indices so that each padded micro-batch stays within budget.

    Longest first, so padding is small; a single response over budget goes alone.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def build_micro_batch(
    prompt: list[int],
    responses: list[list[int]],
    behavior: list[list[float]],
    indices: list[int],
    pad_id: int,
) -> MicroBatch:
    """Responses ``indices`` of one prompt's group."""
    return build_rows([(prompt, responses[i], behavior[i]) for i in indices], indices, pad_id)


def build_rows(rows: list[tuple[list[int], list[int], list[float]]], indices: list[int], pad_id: int) -> MicroBatch:
    """(prompt, response, behavior log-probs) rows, each its own prompt, left padded to one width."""
    total = max(len(p) + len(r) for p, r, _ in rows)
    resp_len = max(len(r) for _, r, _ in rows)
    b = len(rows)
    input_ids = torch.full((b, total), pad_id, dtype=torch.long)
    attention = torch.zeros((b, total), dtype=torch.long)
    targets = torch.full((b, resp_len), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((b, resp_len), dtype=torch.float32)
    beh = torch.zeros((b, resp_len), dtype=torch.float32)
    for row, (prompt, response, behavior) in enumerate(rows):
        seq, n = list(prompt) + list(response), len(response)
        input_ids[row, total - len(seq):] = torch.tensor(seq)
        attention[row, total - len(seq):] = 1
        if n:
            targets[row, resp_len - n:] = torch.tensor(response)
            resp_mask[row, resp_len - n:] = 1.0
            beh[row, resp_len - n:] = torch.tensor(behavior, dtype=torch.float32)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return MicroBatch(list(indices), input_ids, attention, positions, targets, resp_mask, beh)
