"""The torch device a setting names: "auto" is resolved here, and only here."""

from __future__ import annotations


def resolve_device(name: str) -> str:
    """``name`` with "auto" resolved: cuda when a GPU is visible, else cpu."""
    if name != "auto":
        return name
    import torch  # here, not at the top: callers' modules stay importable without torch

    return "cuda" if torch.cuda.is_available() else "cpu"
