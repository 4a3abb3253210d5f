"""The command line a benchmark records in its JSON, without this machine's paths.

A path outside the repository (a scratch folder, a cache) means nothing to a reader elsewhere:
it is recorded as ``DIR`` followed by its last folder name, so the command still reads as what
was run. Paths inside the repository are recorded relative to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def command_line(script: str, argv: list[str] | None = None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", script, *(_portable(a) for a in args)])


def _portable(arg: str) -> str:
    name, eq, value = arg.partition("=")
    if eq and value.startswith("/") and not name.startswith("/"):  # NAME=/path (a reading script's --work, --report)
        return f"{name}={_portable(value)}"
    if not arg.startswith("/"):
        return arg
    path = Path(arg).resolve()
    if path.is_relative_to(REPO):
        return str(path.relative_to(REPO))
    return f"DIR/{path.name}"
