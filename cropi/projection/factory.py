"""``make_projector``: the projector a spec names, from one table of kind -> class."""

from __future__ import annotations

from typing import Mapping

import torch

from cropi.errors import InvalidInputError
from cropi.projection.base import DEFAULT_CHUNK, Projector
from cropi.projection.dense import DEFAULT_BLOCK_ELEMS, DenseProjector
from cropi.projection.factored import FactoredProjector
from cropi.projection.identity import IdentityProjector
from cropi.projection.sjlt import SJLTProjector
from cropi.projection.spec import ProjectionSpec
from cropi.projection.tensorsketch import TensorSketchProjector

# Every kind ProjectionSpec accepts, and the class that projects it (tests/test_projection.py checks the
# two lists agree, so a kind added to the spec without a class here fails a test, not a run).
PROJECTORS: dict[str, type[Projector]] = {
    "sjlt": SJLTProjector,
    "gaussian": DenseProjector,
    "rademacher": DenseProjector,
    "identity": IdentityProjector,
    "factored": FactoredProjector,
    "tensorsketch": TensorSketchProjector,
}


class UnknownKindError(InvalidInputError):
    """A spec names a projection kind no projector implements."""


def projector_class(kind: str) -> type[Projector]:
    """The class that projects ``kind``; refuses a kind it does not know, naming the known ones."""
    try:
        return PROJECTORS[kind]
    except (KeyError, TypeError):
        raise UnknownKindError(f"unknown projection kind {kind!r}; the known kinds are: "
                               f"{', '.join(PROJECTORS)}") from None


def make_projector(spec: ProjectionSpec, param_shapes: Mapping[str, tuple[int, ...]],
                   device: str | torch.device = "cpu", *, cache: bool = True,
                   chunk_coords: int = DEFAULT_CHUNK, max_block_elems: int = DEFAULT_BLOCK_ELEMS) -> Projector:
    """Build the projector for ``spec`` over the parameters in ``param_shapes`` (name -> shape, in order).

    ``cache=False`` rebuilds the per-coordinate plans on every call instead of
    keeping them on ``device`` (slower; for models whose plans would not fit).
    ``chunk_coords`` bounds the temporaries of one step; ``max_block_elems``
    bounds the dense kinds' generated blocks. None of these change the result
    beyond float32 rounding.
    """
    cls = projector_class(spec.kind)
    options = {"max_block_elems": max_block_elems} if issubclass(cls, DenseProjector) else {}  # dense kinds only
    return cls(spec, param_shapes, device=device, cache=cache, chunk_coords=chunk_coords, **options)
