"""A script of benchmarks/ loaded as a module, for the tests of its reading functions (the scripts are run by path,
not installed, so a test cannot import them by name)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` (``name`` may name a subfolder: ``gpu/check``), executed as a fresh module."""
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
