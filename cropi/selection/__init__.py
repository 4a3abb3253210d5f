"""Selection: one registry of selectors (name -> rule with its closed options), every door's one way
to turn a checkpoint's scores into a stage subset (cropi.selection.base has what they may know)."""

from cropi.selection import controls, influence  # noqa: F401  (registers the selectors)
from cropi.selection.base import (REGISTRY, NoOptions, Selection, SelectionInputs, Selector, fraction_count, filled,
                                  get_selector)
from cropi.selection.controls import pass_rate_score, pass_rates

SELECTORS = tuple(REGISTRY)
# The primary: CROPI's rule has the highest expected gain measured (3.1x and 3.5x full-pool training on
# the two held-out tasks of issue 32, mean 2.4x over the three tasks with figures against diverse's 1.7x), and
# a checked curriculum (cropi.pipeline.curriculum.check, the default) removes its harm where it has any. A
# ranking alone is not checked: its meta carries the concentration risk (cropi.scoring.diagnostics).
DEFAULT_SELECTOR = "cropi"
# A checked curriculum's second arm: where CROPI's rule loses (lists) it is the best measured, 1.70x against
# informative's 0.94x (docs/demo.md, issue 32's design). Issue 27's decision had made it the default.
FALLBACK_SELECTOR = "diverse"
# Selectors computed beside the influence ranking (by the score step), the others from theta_0's trajectories.
RANKING_SELECTORS = tuple(n for n, s in REGISTRY.items() if "ranking" in s.needs)


def select(name: str, inputs: SelectionInputs, options=None) -> Selection:
    """The subset selector ``name`` picks from ``inputs``, with what picked it."""
    selector = get_selector(name)
    opts = selector.parse_options(options)
    return Selection(name, opts.model_dump(mode="json"), selector.select(inputs, opts))


__all__ = ["DEFAULT_SELECTOR", "FALLBACK_SELECTOR", "RANKING_SELECTORS", "REGISTRY", "SELECTORS", "NoOptions", "Selection",
           "SelectionInputs", "Selector", "filled", "fraction_count", "get_selector", "pass_rate_score", "pass_rates", "select"]
