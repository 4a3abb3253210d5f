"""An old revision of cropi against the working tree, side by side: what the revision benchmarks share.

Each side runs in a process of its own with ``PYTHONPATH`` at its code (``cropi/`` of the revision,
extracted by ``git archive``, or the working tree), and prints its result as the last line of its
output, in JSON. The sides alternate and their order rotates round by round, so load on a shared
machine hits both alike.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def extract(rev: str, into: Path) -> Path:
    """``cropi/`` at ``rev`` under ``into`` (importable from there)."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, "cropi"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_side(code: Path, script: str, args: list[str], timeout: int = 1800) -> dict:
    """``python script args`` with cropi imported from ``code``: the JSON of its last output line."""
    env = dict(os.environ, PYTHONPATH=str(code))
    proc = subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alternate(baseline: str, rounds: int, run: Callable[[Path, Path], dict],
              show: Callable[[dict], str]) -> dict[str, list[dict]]:
    """``{"baseline": [...], "working_tree": [...]}``: ``run(code, scratch)`` of each side, ``rounds`` times in
    rotating order, each round printed with ``show`` of its result. ``scratch`` is a fresh folder per run."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sides = {"baseline": extract(baseline, tmp / "baseline"), "working_tree": REPO}
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        names = list(sides)
        for r in range(rounds):
            for name in names[r % 2:] + names[:r % 2]:
                runs[name].append(run(sides[name], tmp / f"scratch-{name}-{r}"))
                print(f"round {r} {name}: {show(runs[name][-1])}", flush=True)
    return runs
