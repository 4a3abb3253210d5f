"""Selection rules of the curriculum baselines: full pool, random fraction, pass-rate heuristic,
informative (random among mixed-reward prompts), oracle.

They share CROPI's trainer, steps and seeds; only the stage subset differs. All
rules are deterministic in their seed, and the fractions are of the whole pool
(rounded up), as CROPI's top 10%.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from cropi.errors import InvalidInputError

if TYPE_CHECKING:
    from cropi.data import PromptRecord


def fraction_count(fraction: float, pool_size: int) -> int:
    """How many prompts a fraction of the pool is: ``ceil(fraction * pool_size)``."""
    if not 0 < fraction <= 1:
        raise InvalidInputError(f"select_fraction must be in (0, 1], got {fraction}")
    return math.ceil(fraction * pool_size)


def select_full(prompt_ids: Sequence[str]) -> list[str]:
    """The whole pool, in pool order."""
    return list(prompt_ids)


def select_random(prompt_ids: Sequence[str], fraction: float, *, seed: int, stage: int) -> list[str]:
    """A uniform random fraction of the pool, drawn afresh at every stage from (seed, stage)."""
    rng = random.Random(f"cropi.random-baseline:{seed}:{stage}")
    return rng.sample(list(prompt_ids), fraction_count(fraction, len(prompt_ids)))


def select_informative(prompt_ids: Sequence[str], rates: Mapping[str, float], fraction: float, *, seed: int,
                       stage: int) -> list[str]:
    """A random fraction of the pool drawn only from prompts whose offline rewards are mixed (0 < p < 1).

    The control that isolates influence: CROPI never selects a zero-advantage prompt, so part
    of what it gains may come from that variance filter alone. Drawn afresh at every stage
    from (seed, stage); when fewer prompts are mixed than the fraction asks, all of them.
    """
    mixed = [p for p in prompt_ids if 0.0 < rates.get(p, 0.0) < 1.0]
    rng = random.Random(f"cropi.informative-baseline:{seed}:{stage}")
    return rng.sample(mixed, min(len(mixed), fraction_count(fraction, len(prompt_ids))))


def select_oracle(pool: Mapping[str, "PromptRecord"], validation: Iterable["PromptRecord"]) -> list[str]:
    """Every pool prompt from a data source the validation sets draw from, in pool order.

    The upper bound a selector could reach when the pool labels its sources: training
    on exactly the target distributions. Not a fraction of the pool: all of those.
    """
    sources = {r.data_source for r in validation}
    chosen = [p for p, r in pool.items() if r.data_source in sources]
    if not chosen:
        raise InvalidInputError(f"no pool prompt shares a data_source with the validation sets ({sorted(sources)}): "
                                "the oracle needs pools whose data_source names the target distributions")
    return chosen


def pass_rates(rewards: Iterable[tuple[str, Sequence[float | None]]]) -> dict[str, float]:
    """Per prompt, the mean of its scored rewards; prompts whose every reward failed are left out."""
    out = {}
    for prompt_id, values in rewards:
        scored = [float(v) for v in values if v is not None]
        if scored:
            out[prompt_id] = sum(scored) / len(scored)
    return out


def pass_rate_score(p: float) -> float:
    """The heuristic's score ``p (1 - p)``: largest for prompts solved half the time."""
    return p * (1.0 - p)


def select_pass_rate(prompt_ids: Sequence[str], rates: Mapping[str, float], fraction: float, *,
                     seed: int) -> list[str]:
    """The top fraction of the pool by ``p (1 - p)``, best first.

    Ties (K samples allow only K+1 pass rates) are broken by a hash of (seed, prompt_id).
    Prompts with ``p (1 - p) = 0`` (always or never solved: every GRPO advantage is zero)
    or without a pass rate are never selected, as CROPI never selects zero-advantage
    prompts, so fewer may come back.
    """
    want = fraction_count(fraction, len(prompt_ids))
    scored = [(pass_rate_score(rates[p]), p) for p in prompt_ids if p in rates]
    useful = [(s, p) for s, p in scored if s > 0]
    useful.sort(key=lambda sp: (-sp[0], _tie_key(seed, sp[1])))
    return [p for _, p in useful[:want]]


def _tie_key(seed: int, prompt_id: str) -> bytes:
    return hashlib.blake2b(f"{seed}\0{prompt_id}".encode(), digest_size=8).digest()
