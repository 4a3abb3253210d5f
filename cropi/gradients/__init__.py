"""POPI: off-policy policy gradients per prompt, projected.

``LossOptions`` is imported without torch (the service's HTTP process reads it); the
computer and the loss are imported on first use.
"""

from cropi.gradients.options import LossOptions
from cropi.utils.lazy import lazy_exports

_TORCH_PARTS = {
    "GradientComputer": "cropi.gradients.computer",
    "make_computer": "cropi.gradients.computer",
    "group_advantages": "cropi.gradients.popi",
    "popi_loss": "cropi.gradients.popi",
}
__getattr__ = lazy_exports(__name__, _TORCH_PARTS)
__all__ = ["LossOptions", *_TORCH_PARTS]
