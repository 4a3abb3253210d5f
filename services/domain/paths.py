"""Confinement of caller-named paths to the configured data roots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .errors import PathOutsideRootsError


def confine(path: str, roots: Iterable[Path]) -> Path:
    """``path`` resolved (symlinks followed, ``..`` collapsed), if it lies under one of ``roots``.

    Relative paths are taken relative to the first root. Raises ``PathOutsideRootsError``
    otherwise, so a caller can never make the service read outside what the operator allowed.
    """
    roots = [Path(os.path.realpath(r)) for r in roots]
    if not roots:
        raise PathOutsideRootsError("the service has no data roots configured: start it with --data-root DIR")
    if not isinstance(path, str) or not path or "\x00" in path:
        raise PathOutsideRootsError(f"{path!r} is not a usable path; name a file under {_show(roots)}")
    candidate = Path(path) if os.path.isabs(path) else roots[0] / path
    real = Path(os.path.realpath(candidate))
    for root in roots:
        if real == root or root in real.parents:
            return real
    raise PathOutsideRootsError(f"{path!r} resolves to {str(real)!r}, outside the service's data roots "
                                f"{_show(roots)}; copy the data under one of them or ask the operator "
                                "to add a --data-root")


def _show(roots: list[Path]) -> str:
    return "[" + ", ".join(str(r) for r in roots) + "]"
