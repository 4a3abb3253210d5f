"""``make_projector``: the projector a spec names."""

from __future__ import annotations

from typing import Mapping

import torch

from cropi.projection.base import DEFAULT_CHUNK, Projector
from cropi.projection.dense import DEFAULT_BLOCK_ELEMS, DenseProjector
from cropi.projection.factored import FactoredProjector
from cropi.projection.identity import IdentityProjector
from cropi.projection.sjlt import SJLTProjector
from cropi.projection.tensorsketch import TensorSketchProjector
from cropi.projection.spec import ProjectionSpec


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
    common = dict(device=device, cache=cache, chunk_coords=chunk_coords)
    if spec.kind == "sjlt":
        return SJLTProjector(spec, param_shapes, **common)
    if spec.kind == "factored":
        return FactoredProjector(spec, param_shapes, **common)
    if spec.kind == "tensorsketch":
        return TensorSketchProjector(spec, param_shapes, **common)
    if spec.kind in ("gaussian", "rademacher"):
        return DenseProjector(spec, param_shapes, max_block_elems=max_block_elems, **common)
    return IdentityProjector(spec, param_shapes, **common)
