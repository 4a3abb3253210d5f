"""Sparse random projection of gradients: ``P(g) = R g[S]``.

``ProjectionSpec`` says what the projection is; ``make_projector`` builds it
over a model's parameter shapes. All randomness is counter-based hashing
(``cropi.utils.hashing``), so equal specs give bit-identical subsets and
matrices in every process and on every device.
"""

from cropi.projection.base import EmptySelectionError, Projector
from cropi.projection.dense import DenseProjector
from cropi.projection.factored import FactoredProjector
from cropi.projection.factory import make_projector
from cropi.projection.identity import IdentityLimitError, IdentityProjector
from cropi.projection.inputs import ProjectionInputError
from cropi.projection.sjlt import SJLTProjector
from cropi.projection.spec import ProjectionSpec, SpecMismatchError

__all__ = [
    "DenseProjector",
    "EmptySelectionError",
    "FactoredProjector",
    "IdentityLimitError",
    "IdentityProjector",
    "ProjectionInputError",
    "ProjectionSpec",
    "Projector",
    "SJLTProjector",
    "SpecMismatchError",
    "make_projector",
]
