"""POPI: off-policy policy gradients per prompt, projected."""

from cropi.gradients.computer import GradientComputer, GradientResult, LossOptions, make_computer
from cropi.gradients.popi import group_advantages, popi_loss

__all__ = ["GradientComputer", "GradientResult", "LossOptions", "group_advantages", "make_computer", "popi_loss"]
