"""Package attributes imported on first use (PEP 562), so a torch-free part of a package
(its options models) can be imported without the torch-backed rest."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from module ``where[name]`` when first asked for."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__
