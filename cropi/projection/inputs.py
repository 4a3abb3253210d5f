"""Checks on what callers hand a projector: parameter shapes and named gradients."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import torch

from cropi.errors import InvalidInputError


class ProjectionInputError(InvalidInputError):
    """Gradients handed to a projector do not fit it (names, shapes, dtypes)."""


def check_shape(name: str, shape) -> tuple[int, ...]:
    """A parameter shape as a tuple of non-negative ints."""
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError:
        raise InvalidInputError(f"shape of {name!r} must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidInputError(f"shape of {name!r} has a negative size: {dims}")
    return dims


def collect_grads(named_grads: Iterable[tuple[str, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]],
                  known: Mapping[str, tuple[int, ...]], selects: Callable[[str], bool]
                  ) -> tuple[dict[str, torch.Tensor], int]:
    """Check (name, (n, *shape) tensor) pairs against the projected ``shapes``; return them by name and n.

    Names the filter leaves out (known parameters that are not projected, or
    unknown names ``selects`` rejects) are skipped; an unknown name the filter
    would project, a duplicate, a wrong shape or a missing parameter is an error.
    """
    grads: dict[str, torch.Tensor] = {}
    n: int | None = None
    for item in named_grads:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ProjectionInputError(f"project() takes (name, tensor) pairs, got {type(item).__name__}")
        name, g = item
        if name not in shapes:
            if name in known or not selects(name):
                continue  # a parameter the filter leaves out
            raise ProjectionInputError(f"gradient for unknown parameter {name!r}: this projector was built for "
                                       f"{len(known)} other parameters; build it from the same model")
        if name in grads:
            raise ProjectionInputError(f"parameter {name!r} appears twice; pass each gradient once")
        want = shapes[name]
        if not isinstance(g, torch.Tensor) or not g.is_floating_point():
            raise ProjectionInputError(f"gradient of {name!r} must be a floating-point tensor, got "
                                       f"{getattr(g, 'dtype', type(g).__name__)}")
        if g.dim() != len(want) + 1 or tuple(g.shape[1:]) != want:
            raise ProjectionInputError(f"gradient of {name!r} has shape {tuple(g.shape)}; expected (n, *{want}) "
                                       "with a leading batch dimension (use g[None] for one gradient)")
        if n is not None and g.shape[0] != n:
            raise ProjectionInputError(f"batch sizes differ: {name!r} has {g.shape[0]} rows, others have {n}")
        n = int(g.shape[0])
        grads[name] = g
    missing = [m for m in shapes if m not in grads]
    if missing:
        raise ProjectionInputError(f"{len(missing)} projected parameter(s) missing, e.g. {missing[:3]}: pass every "
                                   "parameter the spec selects exactly once")
    return grads, int(n or 0)
