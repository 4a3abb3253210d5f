"""Confinement of caller-named paths to the configured data roots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from cropi.errors import InvalidInputError

from .errors import PathOutsideRootsError

NAME_MAX = 255  # bytes in one path component (Linux); longer ones make every file call fail
PATH_MAX = 4096


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
    too_long = [c for c in path.split("/") if len(c.encode(errors="surrogatepass")) > NAME_MAX]
    if too_long:
        raise InvalidInputError(f"a component of {path[:80]!r}... is {len(too_long[0])} characters long; file "
                                f"names have at most {NAME_MAX} bytes: check the path")
    candidate = Path(path) if os.path.isabs(path) else roots[0] / path
    real = Path(os.path.realpath(candidate))
    if len(os.fsencode(str(real))) >= PATH_MAX:
        raise InvalidInputError(f"{path[:80]!r}... resolves to a path longer than {PATH_MAX} bytes: check the path")
    for root in roots:
        if real == root or root in real.parents:
            return real
    raise PathOutsideRootsError(f"{path!r} resolves to {str(real)!r}, outside the service's data roots "
                                f"{_show(roots)}; copy the data under one of them or ask the operator "
                                "to add a --data-root")


def confine_tree(path: str, roots: Iterable[Path]) -> Path:
    """``confine`` for ``path`` and, when it is a folder, for the real path of everything under it.

    Run when a job starts, right before the library opens the files: a file inside a confined
    folder may be a symlink to anywhere, and the folder itself may have been swapped for a
    symlink since the request was accepted.
    """
    roots = list(roots)
    real = confine(path, roots)
    if real.is_dir():
        for dirpath, dirs, files in os.walk(real):
            for name in (*dirs, *files):
                inner = os.path.join(dirpath, name)
                confine(inner, roots)  # realpath inside: a symlink is judged by where it leads
    return real


def _show(roots: list[Path]) -> str:
    return "[" + ", ".join(str(r) for r in roots) + "]"
