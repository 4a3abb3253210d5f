"""The generation-backend interface: K sampled responses per prompt with raw log-probs.

Every backend returns, for each sampled token, the behavior model's own
log-probability at temperature 1 (log-softmax of the raw logits, before
temperature and top-p), which is what teacher forcing the behavior model gives.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from cropi.errors import InvalidInputError
from cropi.generation.options import SamplingConfig

FinishReason = Literal["stop", "length"]
SEED_BITS = 62  # vLLM gives the k-th sample of a request seed + k; leave room below 2**63


@dataclass
class Sample:
    """One response: its tokens (EOS included when generated) and raw log-probs, one per token."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise InvalidInputError(f"a sample has {len(self.token_ids)} tokens but {len(self.logprobs)} "
                                    "log-probs: a backend must give one log-prob per token")


class GenerationError(InvalidInputError):
    """Generation was asked something it cannot do."""


class GenerationBackend(ABC):
    """Samples K responses per prompt from one checkpoint.

    ``max_model_len`` is the longest prompt + response the backend accepts; check
    prompts against it (``check_prompt_fits``) before writing anything.
    """

    max_model_len: int

    @abstractmethod
    def generate(self, prompts: list[list[int]], keys: list[str], cfg: SamplingConfig) -> list[list[Sample]]:
        """``cfg.samples`` responses for each prompt (token ids), in prompt order.

        ``keys`` (prompt ids) seed each prompt separately: ``prompt_seed(cfg.seed, key)``,
        so a prompt's samples do not depend on which other prompts share its batch.
        """

    def close(self) -> None:
        """Release the engine and its memory; the backend is unusable afterwards."""

    def __enter__(self) -> "GenerationBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prompt_seed(seed: int, key: str) -> int:
    """A stable per-prompt seed from the run seed and the prompt id (sha256, not ``hash()``)."""
    digest = hashlib.sha256(f"cropi.generation.v1\0{int(seed)}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << SEED_BITS) - 1)


def check_batch(prompts: list[list[int]], keys: list[str]) -> None:
    """Prompts and keys must pair up, keys be unique, and every prompt non-empty."""
    if len(prompts) != len(keys):
        raise GenerationError(f"{len(prompts)} prompts but {len(keys)} keys: pass one key (prompt id) per prompt")
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})[:5]
        raise GenerationError(f"duplicate prompt keys {dup}: each prompt needs its own id so it gets its own seed")
    for key, ids in zip(keys, prompts):
        if not ids:
            raise GenerationError(f"prompt {key!r} has no tokens: render it with render_prompt first")
