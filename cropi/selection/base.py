"""What a selector is, what it may know, and the one registry of them.

A selector turns what is already paid for at the current checkpoint into the stage subset:
the pool (and its prompt records), theta_0's offline pass rates, the influence ranking at
theta_m with the pool's projected gradients, the validation sets' records. Each selector
names what it needs; a missing input is an error that names the command computing it.
Every selector takes the share of the pool to select the same way (``fraction_count``).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from cropi.errors import InvalidInputError, format_validation_error

if TYPE_CHECKING:
    from cropi.data import PromptRecord
    from cropi.scoring import Ranking


class NoOptions(BaseModel):
    """A selector without options of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# What computes each input, for the error a selector without it gets.
PRODUCERS = {
    "pass_rates": "collect the pool's offline trajectories (`cropi collect`; a curriculum does it for you)",
    "ranking": "score the checkpoint (`cropi score`, or `cropi gradients` then `cropi rank`) against validation sets",
    "vectors": "compute the pool's projected gradients at the checkpoint (`cropi gradients`)",
    "records": "give the pool's prompt file (its records name each prompt's data_source)",
    "validation": "give the validation sets' prompt files",
}


@dataclass
class SelectionInputs:
    """Everything a selector may read. ``prompt_ids`` is the pool in pool order; the ranking's
    rows and ``vectors`` are in ``ranking.prompt_ids`` order. ``salt`` makes a random draw
    fresh at every stage (the stage index, or the scored checkpoint's name)."""

    prompt_ids: Sequence[str]
    fraction: float
    seed: int = 0
    salt: str = "0"
    pass_rates: Optional[Mapping[str, float]] = None
    ranking: Optional["Ranking"] = None
    vectors: Optional[np.ndarray] = None
    records: Optional[Mapping[str, "PromptRecord"]] = None
    validation: Optional[Sequence["PromptRecord"]] = None

    @property
    def count(self) -> int:
        return fraction_count(self.fraction, len(self.prompt_ids))

    def rng(self, name: str) -> random.Random:
        return random.Random(f"cropi.selector.{name}:{self.seed}:{self.salt}")


@dataclass(frozen=True)
class Selector:
    """A rule with its closed options model and the inputs it reads."""

    name: str
    rule: Callable[[SelectionInputs, BaseModel], list[str]]
    summary: str
    needs: tuple[str, ...] = ()
    options: type[BaseModel] = NoOptions

    def parse_options(self, options: Mapping | BaseModel | None) -> BaseModel:
        if isinstance(options, self.options):
            return options
        try:
            return self.options.model_validate(dict(options or {}))
        except ValidationError as e:
            raise InvalidInputError(f"bad options for selector {self.name!r}: {format_validation_error(e)}") from None

    def select(self, inputs: SelectionInputs, options: Mapping | BaseModel | None = None) -> list[str]:
        missing = [n for n in self.needs if getattr(inputs, n) is None]
        if missing:
            how = "; ".join(f"{n}: {PRODUCERS[n]}" for n in missing)
            raise InvalidInputError(f"selector {self.name!r} needs {', '.join(missing)}, which this call lacks: {how}")
        return self.rule(inputs, self.parse_options(options))


REGISTRY: dict[str, Selector] = {}


def register(selector: Selector) -> Selector:
    if selector.name in REGISTRY:
        raise ValueError(f"selector {selector.name!r} registered twice")
    REGISTRY[selector.name] = selector
    return selector


def get_selector(name: str) -> Selector:
    """The registered selector ``name``; an unknown name is refused, listing the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise InvalidInputError(f"unknown selector {name!r}: choose one of {', '.join(REGISTRY)}") from None


def fraction_count(fraction: float, pool_size: int) -> int:
    """How many prompts a fraction of the pool is: ``ceil(fraction * pool_size)`` (CROPI's top 10%)."""
    if not 0 < fraction <= 1:
        raise InvalidInputError(f"select_fraction must be in (0, 1], got {fraction}")
    return math.ceil(fraction * pool_size)


def filled(chosen: Sequence[str], prompt_ids: Sequence[str], fraction: float | None, rng: random.Random, *,
           at_least: int = 0) -> list[str]:
    """``chosen`` in its order, then a uniform draw without replacement from the other ``prompt_ids`` (taken in
    their order, so the draw depends on ``rng`` alone) up to ``fraction_count(fraction, len(prompt_ids))`` (None:
    ``chosen``'s own size), and to at least ``at_least`` (the pool's size at most).

    A ranking selector picks among its candidates only, so a fraction above their share comes back short;
    filled, fraction 1 is the whole pool. ``at_least``: a trainer's step takes a batch of distinct prompts, so a
    stage subset holds at least one batch. The rest has no ranking this selector trusts, hence uniform."""
    have = set(chosen)
    want = max(len(chosen) if fraction is None else fraction_count(fraction, len(prompt_ids)),
               min(at_least, len(prompt_ids)))
    stray = sorted(have - set(prompt_ids))
    if len(have) != len(chosen) or stray:
        raise InvalidInputError(
            "a selection to fill must be distinct prompts of the pool: it "
            + (f"holds {len(stray)} the pool lacks (e.g. {stray[:3]}); the pool file changed after scoring: start a "
               "new curriculum" if stray else f"repeats {len(chosen) - len(have)} of its prompts, which is a bug of the selector: please report it"))
    rest = [p for p in prompt_ids if p not in have]
    return [*chosen, *rng.sample(rest, max(0, want - len(chosen)))]


def tie_key(seed: int, prompt_id: str) -> bytes:
    return hashlib.blake2b(f"{seed}\0{prompt_id}".encode(), digest_size=8).digest()


@dataclass
class Selection:
    """A selector's answer with what it was: recorded with every stored ranking and stage."""

    selector: str
    options: dict
    chosen: list[str] = field(default_factory=list)

    def record(self) -> dict:
        return {"selector": self.selector, "selector_options": self.options}
