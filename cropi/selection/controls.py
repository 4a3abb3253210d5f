"""The control selectors: full pool, random fraction, p(1-p), informative, oracle.

They share CROPI's trainer, steps and seeds in a comparison; only the stage subset differs.
Every rule is deterministic in its seed (and the stage's salt), and fractions are of the
whole pool, rounded up (``fraction_count``).
"""

from __future__ import annotations

import random
from typing import Iterable, Sequence

from cropi.errors import InvalidInputError
from cropi.selection.base import NoOptions, SelectionInputs, Selector, register, tie_key


def _full(inp: SelectionInputs, _: NoOptions) -> list[str]:
    return list(inp.prompt_ids)


def _random(inp: SelectionInputs, _: NoOptions) -> list[str]:
    rng = random.Random(f"cropi.random-baseline:{inp.seed}:{inp.salt}")
    return rng.sample(list(inp.prompt_ids), inp.count)


def _informative(inp: SelectionInputs, _: NoOptions) -> list[str]:
    mixed = [p for p in inp.prompt_ids if 0.0 < inp.pass_rates.get(p, 0.0) < 1.0]
    rng = random.Random(f"cropi.informative-baseline:{inp.seed}:{inp.salt}")
    return rng.sample(mixed, min(len(mixed), inp.count))


def pass_rate_score(p: float) -> float:
    """The heuristic's score ``p (1 - p)``: largest for prompts solved half the time."""
    return p * (1.0 - p)


def _pass_rate(inp: SelectionInputs, _: NoOptions) -> list[str]:
    rates = inp.pass_rates
    useful = [(pass_rate_score(rates[p]), p) for p in inp.prompt_ids if p in rates and pass_rate_score(rates[p]) > 0]
    useful.sort(key=lambda sp: (-sp[0], tie_key(inp.seed, sp[1])))
    return [p for _, p in useful[:inp.count]]


def _oracle(inp: SelectionInputs, _: NoOptions) -> list[str]:
    sources = {r.data_source for r in inp.validation}
    chosen = [p for p in inp.prompt_ids if inp.records[p].data_source in sources]
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


FULL = register(Selector("full", _full, "the whole pool at every stage"))
RANDOM = register(Selector("random", _random, "a uniform random fraction of the pool, afresh every stage"))
PASS_RATE = register(Selector(
    "pass_rate", _pass_rate, "the fraction with the highest p(1-p) of theta_0's offline pass rate (never p(1-p)=0)",
    needs=("pass_rates",)))
INFORMATIVE = register(Selector(
    "informative", _informative, "a random fraction drawn from the prompts whose offline rewards are mixed "
    "(0 < p < 1), afresh every stage: the control that isolates influence from the variance filter",
    needs=("pass_rates",)))
ORACLE = register(Selector(
    "oracle", _oracle, "every pool prompt whose data_source a validation set draws from (not a fraction): "
    "the upper bound when the pool labels its sources", needs=("records", "validation")))
