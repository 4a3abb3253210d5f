"""Sparse random projection of gradients: ``P(g) = R g[S]``.

``ProjectionSpec`` says what the projection is; ``make_projector`` builds it
over a model's parameter shapes. All randomness is counter-based hashing
(``cropi.utils.hashing``), so equal specs give bit-identical subsets and
matrices in every process and on every device.

``ProjectionSpec`` is imported without torch (the service's HTTP process reads it);
the projectors are imported on first use.
"""

from cropi.projection.spec import ProjectionSpec, SpecMismatchError
from cropi.utils.lazy import lazy_exports

_TORCH_PARTS = {
    "DenseProjector": "cropi.projection.dense",
    "EmptySelectionError": "cropi.projection.base",
    "FactoredProjector": "cropi.projection.factored",
    "IdentityLimitError": "cropi.projection.identity",
    "IdentityProjector": "cropi.projection.identity",
    "ProjectionInputError": "cropi.projection.inputs",
    "Projector": "cropi.projection.base",
    "SJLTProjector": "cropi.projection.sjlt",
    "TensorSketchProjector": "cropi.projection.tensorsketch",
    "UnknownKindError": "cropi.projection.factory",
    "make_projector": "cropi.projection.factory",
}
__getattr__ = lazy_exports(__name__, _TORCH_PARTS)
__all__ = ["ProjectionSpec", "SpecMismatchError", *_TORCH_PARTS]
